#include "generation/prompt_template.h"

#include "generation/family_templates.h"

namespace tandem::gen {

std::string_view template_name(TemplateKind k) {
  switch (k) {
    case TemplateKind::raw: return "raw";
    case TemplateKind::llama2: return "llama2";
    case TemplateKind::chatml: return "chatml";
    case TemplateKind::zephyr: return "zephyr";
    case TemplateKind::model: return "model";
  }
  return "raw";
}

Result<TemplateKind> parse_template(std::string_view name) {
  for (auto k : {TemplateKind::raw, TemplateKind::llama2, TemplateKind::chatml, TemplateKind::zephyr,
                 TemplateKind::model})
    if (template_name(k) == name) return k;
  return fail(Errc::invalid_argument,
              "unknown prompt template '" + std::string(name) + "' (known: raw, llama2, chatml, zephyr, model)");
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
      out.push_back({Segment::bos, {}});
      if (first_user && !system.empty()) {
        out.push_back({Segment::markup, "[INST] <<SYS>>\n"});
        out.push_back({Segment::text, system});
        out.push_back({Segment::markup, "\n<</SYS>>\n\n"});
      } else {
        out.push_back({Segment::markup, "[INST] "});
      }
      out.push_back({Segment::text, m[i].content});
      out.push_back({Segment::markup, " [/INST]"});
      first_user = false;
    } else {
      out.push_back({Segment::markup, " "});
      out.push_back({Segment::text, m[i].content});
      out.push_back({Segment::markup, " "});
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
      out.push_back({Segment::bos, {}});
      for (const auto& m : messages) {
        out.push_back({Segment::markup, "<|im_start|>" + m.role + "\n"});
        out.push_back({Segment::text, m.content});
        out.push_back({Segment::markup, "<|im_end|>\n"});
      }
      out.push_back({Segment::markup, "<|im_start|>assistant\n"});
      return out;
    }
    case TemplateKind::zephyr: {
      out.push_back({Segment::bos, {}});
      for (const auto& m : messages) {
        out.push_back({Segment::markup, "<|" + m.role + "|>\n"});
        out.push_back({Segment::text, m.content});
        out.push_back({Segment::eos, {}});
        out.push_back({Segment::markup, "\n"});
      }
      out.push_back({Segment::markup, "<|assistant|>\n"});
      return out;
    }
    case TemplateKind::model:
      return fail(Errc::invalid_argument,
                  "the 'model' template is the model's own chat_template: the engine renders it (gen::ChatTemplate)");
  }
  return fail(Errc::internal, "unhandled template");
}

std::string_view builtin_template_source(TemplateKind kind) {
  switch (kind) {
    case TemplateKind::llama2:
    case TemplateKind::chatml:
    case TemplateKind::zephyr: return family_template(template_name(kind));
    case TemplateKind::raw:
    case TemplateKind::model: return {};
  }
  return {};
}

std::vector<std::string> template_stops(TemplateKind kind) {
  switch (kind) {
    case TemplateKind::chatml: return {"<|im_end|>"};
    case TemplateKind::zephyr: return {"<|user|>"};
    case TemplateKind::raw:
    case TemplateKind::llama2:
    case TemplateKind::model: return {};  // the model's end-of-turn ids stop it (Model::eos_ids)
  }
  return {};
}

}  // namespace tandem::gen
