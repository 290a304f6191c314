#include "generation/chat_template.h"

#include <exception>
#include <new>

#include "generation/jinja_eval.h"
#include "generation/jinja_parser.h"

namespace tandem::gen {

namespace {

Error to_error(const jinja::Error& e, const std::string& origin) {
  std::string where = origin + (e.line > 0 ? ":" + std::to_string(e.line) : std::string()) + ": ";
  return make_error(e.code, where + e.message);
}

}  // namespace

Result<ChatTemplate> ChatTemplate::parse(std::string_view source, std::string origin) {
  if (source.size() > kMaxSourceBytes)
    return fail(Errc::invalid_argument, origin + ": template of " + std::to_string(source.size()) +
                                            " bytes is over the limit of " + std::to_string(kMaxSourceBytes));
  ChatTemplate t;
  t.source_ = std::string(source);
  t.origin_ = std::move(origin);
  try {
    t.body_ = std::make_shared<const jinja::Body>(jinja::parse_template(t.source_));
  } catch (const jinja::Error& e) {
    return fail(to_error(e, t.origin_));
  } catch (const std::bad_alloc&) {
    return fail(Errc::out_of_memory, t.origin_ + ": out of memory while parsing");
  } catch (const std::exception& e) {
    return fail(Errc::internal, t.origin_ + ": " + e.what());
  }
  return t;
}

Result<std::vector<RenderedPiece>> ChatTemplate::render(const std::vector<Message>& messages,
                                                        const ChatTemplateOptions& options) const {
  using jinja::Text;
  using jinja::Value;
  try {
    jinja::List list;
    for (const Message& m : messages) {
      jinja::Dict d;
      d.emplace_back(Text("role", true), Value::string(m.role, false));
      d.emplace_back(Text("content", true), Value::string(m.content, false));
      list.push_back(Value::make_dict(std::move(d)));
    }
    std::map<std::string, Value> globals;
    globals["messages"] = Value::make_list(std::move(list));
    globals["add_generation_prompt"] = Value::boolean(options.add_generation_prompt);
    globals["bos_token"] = Value::string(options.bos_token, true);
    globals["eos_token"] = Value::string(options.eos_token, true);
    globals["tools"] = Value::none();
    globals["documents"] = Value::none();
    for (const auto& [k, v] : options.special_vars) globals[k] = Value::string(v, true);
    for (const auto& [k, v] : options.flag_vars) globals[k] = Value::boolean(v);
    jinja::Limits limits;
    limits.max_output_bytes = options.max_output_bytes;
    Text out = jinja::render(*body_, globals, limits, options.clock);
    std::vector<RenderedPiece> pieces;
    std::size_t pos = 0;
    for (const Text::Run& r : out.runs()) {
      pieces.push_back(RenderedPiece{out.str().substr(pos, r.length), r.trusted});
      pos += r.length;
    }
    return pieces;
  } catch (const jinja::Error& e) {
    return fail(to_error(e, origin_));
  } catch (const std::bad_alloc&) {
    return fail(Errc::out_of_memory, origin_ + ": out of memory while rendering");
  } catch (const std::exception& e) {
    return fail(Errc::internal, origin_ + ": " + e.what());
  }
}

std::string flatten(const std::vector<RenderedPiece>& pieces) {
  std::string s;
  for (const auto& p : pieces) s += p.text;
  return s;
}

}  // namespace tandem::gen
