// libFuzzer target: the GGUF reader and everything built on it, on hostile bytes (scripts/fuzz.sh runs it with ASan +
// UBSan). The input is a whole file:
//   1. GgufFile::parse (from memory). If it opens: every tensor view lies inside the data section, offsets are
//      aligned, names and keys are unique, tensor_data() agrees with the type; then the SentencePiece ModelProto
//      rebuilt from its tokenizer.ggml.* metadata, which — when it is built at all — must load in the native tokenizer
//      without a protobuf *parse* error (that would be a bug in our serializer), and encode/decode a short text.
//      The BERT-family reading (bert_config_from_gguf, its tensor views, the WordPiece vocabulary encoding a text).
//   2. ModelDir::open on the same bytes as a file (a memfd under /proc/self/fd): the llama.* mapping, required
//      tensors, types, shapes; if it opens, every tensor view lies inside the mapping and the shapes match the bytes.
// Anything else than "ok or a typed error" — a crash, a sanitizer report, a broken invariant (abort) — is a finding.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>

#include "tokenizer/tokenizer.h"
#include "tokenizer/wordpiece.h"
#include "weights/bert_layout.h"
#include "weights/gguf.h"
#include "weights/gguf_tokenizer.h"
#include "weights/gguf_model.h"
#include "weights/model_dir.h"

namespace {

using namespace tandem;
using namespace tandem::weights;

void check(bool ok) {
  if (!ok) std::abort();
}

void check_file(const GgufFile& f) {
  const auto all = f.bytes();
  check(f.header_bytes().size() <= all.size());
  check(f.alignment() != 0 && (f.alignment() & (f.alignment() - 1)) == 0);
  std::set<std::string_view> names;
  for (const auto& t : f.tensors()) {
    check(names.insert(t.name).second);
    check(!t.ne.empty() && t.ne.size() <= 4);
    check(t.offset % f.alignment() == 0);
    check(f.find_tensor(t.name) == &t);
    const auto b = f.raw_tensor_bytes(t);
    check(b.size() == (t.size_known ? t.nbytes : 0));
    if (!b.empty()) check(b.data() >= all.data() + f.data_offset() && b.data() + b.size() <= all.data() + all.size());
    auto d = f.tensor_data(t);
    check(d.ok() == t.wtype.has_value());
    if (!d.ok()) check(d.error().code == Errc::unsupported);
  }
  std::set<std::string_view> keys;
  for (const auto& [k, v] : f.metadata()) {
    check(keys.insert(k).second);
    check(f.find(k) == &v);
  }
  auto proto = sentencepiece_model_from_gguf(f);
  if (!proto.ok()) {
    check(proto.error().code == Errc::format_error || proto.error().code == Errc::unsupported);
    return;
  }
  auto tok = tok::Tokenizer::from_bytes(*proto, "fuzz");
  if (!tok.ok()) {
    check(tok.error().code != Errc::parse_error);  // our own protobuf must always parse
    return;
  }
  const auto ids = tok->encode("Hello world, \xC3\xA9t\xC3\xA9 1234", true, true);
  (void)tok->decode(ids);
}

// The BERT-family reading of the file: its configuration, tensor views inside the file, and its WordPiece
// vocabulary encoding a text within the positions, [CLS] first and [SEP] last.
void check_bert(const GgufFile& f) {
  auto c = bert_config_from_gguf(f);
  if (c.ok()) {
    check(c->hidden > 0 && c->heads > 0 && c->hidden % c->heads == 0 && c->vocab > 0);
    auto views = bert_tensor_views_from_gguf(f, *c);
    if (views.ok()) {
      const auto all = f.bytes();
      for (const auto& t : *views)
        if (!t.data.empty()) check(t.data.data() >= all.data() && t.data.data() + t.data.size() <= all.data() + all.size());
    } else {
      check(views.error().code == Errc::format_error);
    }
  } else {
    check(c.error().code == Errc::format_error || c.error().code == Errc::unsupported);
  }
  auto toks = wordpiece_tokens_from_gguf(f);
  if (!toks.ok()) {
    check(toks.error().code == Errc::format_error || toks.error().code == Errc::unsupported);
    return;
  }
  auto wp = tok::WordPieceTokenizer::from_tokens(std::move(toks).value(), "fuzz");
  if (!wp.ok()) {
    check(wp.error().code == Errc::format_error);
    return;
  }
  const auto ids = wp->encode("Hello, w\xC3\xB6rld \xE4\xB8\xAD\xE6\x96\x87 ##x [CLS] \xFF", 8);
  check(ids.size() >= 2 && ids.size() <= 8 && ids.front() == wp->cls_id() && ids.back() == wp->sep_id());
  for (auto id : ids) check(id >= 0 && id < wp->vocab_size());
}

int memfd() {
  static const int fd = ::memfd_create("fuzz-gguf", MFD_CLOEXEC);
  if (fd < 0) std::abort();
  return fd;
}

void check_model_dir(const std::uint8_t* data, std::size_t size) {
  const int fd = memfd();
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) std::abort();
  auto m = ModelDir::open("/proc/self/fd/" + std::to_string(fd));
  if (!m.ok()) return;
  check(m->format() == ModelDir::Format::gguf);
  const MappedFile* mf = m->mapped_files().at(0);
  for (const auto& t : m->tensors()) {
    if (t.data.empty()) continue;
    check(t.data.data() >= mf->data() && t.data.data() + t.data.size() <= mf->data() + mf->size());
  }
  for (const auto& [name, shape] : ModelDir::required_tensors(m->config())) {
    const TensorView* t = m->tensor(name);
    check(t != nullptr && t->type_supported && t->shape == shape);
    const std::int64_t rows = shape.size() == 2 ? shape[0] : 1;
    check(t->data.size() == kernels::row_bytes(t->type, shape.back()) * static_cast<std::size_t>(rows));
  }
  (void)m->type_summary();
  (void)m->header_digest();
  (void)m->tokenizer_bytes();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto f = GgufFile::parse(std::span<const std::byte>(reinterpret_cast<const std::byte*>(data), size), "fuzz.gguf");
  if (f.ok()) {
    check_file(*f);
    check_bert(*f);
  } else {
    check(f.error().code == Errc::format_error || f.error().code == Errc::unsupported);
  }
  check_model_dir(data, size);
  return 0;
}
