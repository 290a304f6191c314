#include "generation/prompt_template.h"

namespace tandem::gen {

std::string_view template_name(TemplateKind k) {
  switch (k) {
    case TemplateKind::raw: return "raw";
    case TemplateKind::llama2: return "llama2";
    case TemplateKind::chatml: return "chatml";
    case TemplateKind::zephyr: return "zephyr";
  }
  return "raw";
}

Result<TemplateKind> parse_template(std::string_view name) {
  for (auto k : {TemplateKind::raw, TemplateKind::llama2, TemplateKind::chatml, TemplateKind::zephyr})
    if (template_name(k) == name) return k;
  return fail(Errc::invalid_argument,
              "unknown prompt template '" + std::string(name) + "' (known: raw, llama2, chatml, zephyr)");
}

namespace {

bool known_role(const std::string& r) { return r == "system" || r == "user" || r == "assistant"; }

Result<std::vector<Segment>> render_llama2(const std::vector<Message>& m) {
  // <s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s><s>[INST] {user} [/INST]
  std::vector<Segment> out;
  std::size_t i = 0;
  std::string system;
  if (m[0].role == "system") {
    system = m[0].content;
    i = 1;
  }
  bool first_user = true;
  bool expect_user = true;
  for (; i < m.size(); ++i) {
    if (m[i].role == "system")
      return fail(Errc::invalid_argument, "llama2 template: a system message may only come first");
    if ((m[i].role == "user") != expect_user)
      return fail(Errc::invalid_argument, "llama2 template: roles must alternate user/assistant (message " +
                                              std::to_string(i) + " is '" + m[i].role + "')");
    if (expect_user) {
      std::string t = "[INST] ";
      if (first_user && !system.empty()) t += "<<SYS>>\n" + system + "\n<</SYS>>\n\n";
      t += m[i].content + " [/INST]";
      out.push_back({Segment::bos, {}});
      out.push_back({Segment::text, std::move(t)});
      first_user = false;
    } else {
      out.push_back({Segment::text, " " + m[i].content + " "});
      out.push_back({Segment::eos, {}});
    }
    expect_user = !expect_user;
  }
  if (expect_user) return fail(Errc::invalid_argument, "llama2 template: the last message must be from the user");
  return out;
}

}  // namespace

Result<std::vector<Segment>> render(TemplateKind kind, const std::vector<Message>& messages) {
  if (messages.empty()) return fail(Errc::invalid_argument, "empty conversation: at least one message is needed");
  for (std::size_t i = 0; i < messages.size(); ++i)
    if (!known_role(messages[i].role))
      return fail(Errc::invalid_argument, "message " + std::to_string(i) + " has unknown role '" +
                                              messages[i].role + "' (system, user, assistant)");
  std::vector<Segment> out;
  switch (kind) {
    case TemplateKind::raw: {
      std::string t;
      for (const auto& m : messages) t += m.content;
      out.push_back({Segment::bos, {}});
      out.push_back({Segment::text, std::move(t)});
      return out;
    }
    case TemplateKind::llama2:
      return render_llama2(messages);
    case TemplateKind::chatml: {
      std::string t;
      for (const auto& m : messages) t += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      t += "<|im_start|>assistant\n";
      out.push_back({Segment::bos, {}});
      out.push_back({Segment::text, std::move(t)});
      return out;
    }
    case TemplateKind::zephyr: {
      out.push_back({Segment::bos, {}});
      for (const auto& m : messages) {
        out.push_back({Segment::text, "<|" + m.role + "|>\n" + m.content});
        out.push_back({Segment::eos, {}});
        out.push_back({Segment::text, "\n"});
      }
      out.push_back({Segment::text, "<|assistant|>\n"});
      return out;
    }
  }
  return fail(Errc::internal, "unhandled template");
}

std::vector<std::string> template_stops(TemplateKind kind) {
  switch (kind) {
    case TemplateKind::chatml: return {"<|im_end|>"};
    case TemplateKind::zephyr: return {"<|user|>"};
    case TemplateKind::raw:
    case TemplateKind::llama2: return {};
  }
  return {};
}

}  // namespace tandem::gen
