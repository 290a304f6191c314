// libFuzzer target: the daemon side of a ring session against hostile shared memory (scripts/fuzz.sh runs it with
// ASan + UBSan). The input becomes the SQ control block, the CQ head (twice), the SQ entries and the request data area
// of a real, initialize()d session (fuzz_ring_input.h); the session sits in the middle of a PROT_NONE region, so any
// read or write outside it faults even where ASan's redzones do not reach. Then, as the hub does: consume() in up to
// three passes, request_from_record() on every submit, embed_from_record() on every embed (answered with one
// `embedded` completion of count × 4 floats, or an error), transcribe_from_record() on every transcribe and
// audio_from_record() on every audio chunk (ABI 1.2; a stream's chunk fed to a real audio::PcmStream), post() completions for every command (records, token
// batches, finished) with a small backlog limit, move the CQ head, flush(), take_wakeup().
//
// Beyond "no crash, no leak, no hang, no sanitizer report", it checks invariants and traps when one breaks:
// the published SQ head equals the consumer's, commands never outnumber consumed entries, an accepted record survives
// write → parse unchanged, and every completion the writer published lies inside the CQ and the response area.
#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "audio/stream.h"
#include "daemon/embed_record.h"
#include "daemon/submit_options.h"
#include "daemon/transcribe_record.h"
#include "fuzz_ring_input.h"
#include "ring/completion_writer.h"
#include "ring/consumer.h"
#include "ring/layout.h"
#include "ring/record.h"

namespace {

using namespace tandem::ring;
namespace fz = tandem::ring::fuzz;

constexpr std::size_t kGuard = 64 * 1024;

struct Mapping {
  std::uint8_t* base = nullptr;
  Layout layout;
};

const Mapping& mapping() {
  static const Mapping m = [] {
    Mapping m;
    auto l = compute_layout(fz::kRequest, LayoutLimits{});
    if (!l) std::abort();
    m.layout = *l;
    m.layout.session_id = 1;
    // [guard | session | guard], the guards PROT_NONE.
    void* region = ::mmap(nullptr, m.layout.total_size + 2 * kGuard, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (region == MAP_FAILED) std::abort();
    m.base = static_cast<std::uint8_t*>(region) + kGuard;
    if (::mprotect(m.base, m.layout.total_size, PROT_READ | PROT_WRITE) != 0) std::abort();
    return m;
  }();
  return m;
}

void check(bool ok) {
  if (!ok) __builtin_trap();
}

// Copies input[at, at+n) (what exists of it) to dst.
void overlay(void* dst, const std::uint8_t* data, std::size_t size, std::size_t at, std::size_t n) {
  if (size <= at) return;
  std::memcpy(dst, data + at, std::min(n, size - at));
}

std::uint32_t input_u32(const std::uint8_t* data, std::size_t size, std::size_t at, std::uint32_t dflt) {
  if (size < at + 4) return dflt;
  std::uint32_t v;
  std::memcpy(&v, data + at, 4);
  return v;
}

// Post, stopping the session at the first fault as the hub does.
bool post(CompletionWriter& w, Completion c) { return w.post(std::move(c)) == Fault::none; }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const Mapping& m = mapping();
  const Layout& l = m.layout;
  const View view{m.base, l};
  // A fresh session: header + control blocks (initialize), entries and data areas cleared.
  initialize(m.base, l);
  std::memset(m.base + l.sqes_offset, 0, l.total_size - l.sqes_offset);

  overlay(view.sq(), data, size, fz::kSqControlAt, sizeof(SqControl));
  overlay(view.sqes(), data, size, fz::kSqesAt, std::uint64_t{l.sq_entries} * kEntrySize);
  overlay(view.request_data(), data, size, fz::kRequestDataAt, l.request_data_size);
  // entries_consumed is statistics the daemon adds to (its initial value is whatever the input says).
  const std::uint64_t consumed_before = load_relaxed64(&view.sq()->entries_consumed);
  const std::uint32_t cq_head_1 = input_u32(data, size, fz::kCqHead1At, 0);
  const std::uint32_t cq_head_2 = input_u32(data, size, fz::kCqHead2At, 0);
  const std::uint8_t max_knob = size > fz::kKnobsAt ? data[fz::kKnobsAt] : 0;
  const std::uint8_t backlog_knob = size > fz::kKnobsAt + 1 ? data[fz::kKnobsAt + 1] : 0;
  const std::uint32_t max = max_knob % 9 == 0 ? 64 : max_knob % 9;
  static constexpr std::uint64_t kBacklogLimits[] = {0, 64, 1024, 1 << 20};

  SubmissionConsumer consumer(view);
  CompletionWriter writer(view, kBacklogLimits[backlog_knob % 4]);
  bool alive = true;
  std::uint32_t total_consumed = 0;
  std::shared_ptr<tandem::audio::PcmStream> stream;  // the last transcribe's stream, if it opened one
  for (int pass = 0; pass < 3 && alive; ++pass) {
    if (pass == 1) store_release(&view.cq()->head, cq_head_1);
    const bool pending = consumer.pending();
    ConsumeResult r = consumer.consume(max);
    if (!pending) check(r.consumed == 0 && r.commands.empty());
    check(r.commands.size() <= r.consumed);
    check(r.consumed <= max && r.consumed <= l.sq_entries);
    total_consumed += r.consumed;
    if (r.consumed > 0) check(load_acquire(&view.sq()->head) == consumer.head());
    if (r.fault != Fault::none) {
      check(!r.detail.empty());
      alive = false;
    } else {
      check(r.commands.size() == r.consumed);
    }
    // A record the daemon's parser refused: an `error` completion with its message (never empty).
    auto refuse = [&](std::uint64_t user_data, const tandem::Error& e) {
      check(!e.message.empty());
      return post(writer, record_completion(Kind::error, user_data, 0,
                                            RecordWriter().add("message", std::string_view(e.message)).take(),
                                            ErrorCode::invalid_argument));
    };
    for (const Command& c : r.commands) {
      bool ok = true;
      switch (c.op) {
        case Opcode::nop:
          check(c.job_id == 0);
          ok = post(writer, record_completion(Kind::nop, c.user_data, 0, {}));
          break;
        case Opcode::cancel:
          ok = post(writer, record_completion(Kind::cancel_result, c.user_data, c.job_id,
                                              RecordWriter().add("state", "cancelled").take()));
          break;
        case Opcode::embed: {
          RecordWriter rw;
          for (const Field& f : c.record) rw.add(f.key, f.value);
          ParsedRecord again = parse_record(rw.bytes());
          check(again.ok() && again.fields == c.record);
          auto req = tandem::daemon::embed_from_record(c.record);
          if (!req) {
            ok = refuse(c.user_data, req.error());
            break;
          }
          check(!req->texts.empty() || !req->images.empty());
          // One vector of 4 per input, derived from its bytes; the record must parse back to the same floats.
          std::vector<std::vector<float>> vectors;
          for (const auto& t : req->texts) vectors.push_back({float(t.size()), 1.0f, -1.0f, 0.5f});
          for (const auto& im : req->images) vectors.push_back({float(im.size()), im.empty() ? 0.0f : float(im[0]), 0.0f, 2.0f});
          RecordWriter out;
          out.add("count", std::uint64_t{vectors.size()}).add("dim", std::uint64_t{4}).add_float32_rows("vectors", vectors);
          ParsedRecord back = parse_record(out.bytes());
          check(back.ok() && std::get<std::vector<float>>(back.find("vectors")->value).size() == vectors.size() * 4);
          ok = post(writer, record_completion(Kind::embedded, c.user_data, c.user_data | 1, out.take()));
          break;
        }
        case Opcode::transcribe: {
          check(c.job_id == 0);
          auto req = tandem::daemon::transcribe_from_record(c.record);
          if (!req) {
            ok = refuse(c.user_data, req.error());
            break;
          }
          check((req->audio != nullptr) != req->stream.has_value());
          if (req->stream) {  // the service's check of the format, and a stream for the chunks that follow
            auto st = tandem::audio::PcmStream::create(*req->stream);
            if (st) stream = std::move(st).value();
          }
          ok = post(writer, record_completion(Kind::accepted, c.user_data, c.user_data | 1,
                                              RecordWriter().add("job_id", c.user_data | 1).take()));
          break;
        }
        case Opcode::audio: {
          check(c.job_id != 0);
          auto chunk = tandem::daemon::audio_from_record(c.record);
          if (!chunk) {
            check(!chunk.error().message.empty());
          } else if (stream) {
            const std::uint64_t before = stream->bytes_received();
            auto st = stream->append(chunk->offset, chunk->pcm, chunk->end);
            // Taken whole, or not at all.
            check(stream->bytes_received() == (st ? before + chunk->pcm.size() : before));
            if (st && chunk->end) check(stream->complete());
          }
          break;
        }
        case Opcode::submit: {
          // The record as the hub gets it: write it back and parse it again — it must not change.
          RecordWriter rw;
          for (const Field& f : c.record) rw.add(f.key, f.value);
          ParsedRecord again = parse_record(rw.bytes());
          check(again.ok() && again.fields == c.record);
          auto req = tandem::daemon::request_from_record(c.record);
          if (!req) {
            ok = refuse(c.user_data, req.error());
            break;
          }
          const std::uint64_t job = c.user_data | 1;
          ok = post(writer, record_completion(Kind::accepted, c.user_data, job, RecordWriter().add("job_id", job).take()));
          // Tokens: one id per prompt byte, in batches of up to 7, text = the prompt bytes.
          const std::string& p = req->prompt;
          for (std::size_t i = 0; ok && i < p.size(); i += 7) {
            const std::size_t n = std::min<std::size_t>(7, p.size() - i);
            std::vector<std::int32_t> ids(n);
            for (std::size_t k = 0; k < n; ++k) ids[k] = static_cast<unsigned char>(p[i + k]);
            ok = post(writer, token_completion(c.user_data, job, static_cast<std::uint32_t>(i), ids, p.substr(i, n)));
          }
          if (ok)
            ok = post(writer, record_completion(Kind::finished, c.user_data, job,
                                                RecordWriter().add("tokens_total", std::uint64_t{p.size()}).take()));
          break;
        }
      }
      if (!ok) {
        alive = false;  // Fault::cq_index: the session ends
        break;
      }
    }
  }
  store_release(&view.cq()->head, cq_head_2);
  const Fault f = writer.flush();
  (void)writer.take_wakeup();
  check(f == Fault::none || f == Fault::cq_index);
  check(load_relaxed64(&view.sq()->entries_consumed) == consumed_before + total_consumed);

  // Everything published lies inside the CQ and the response area.
  const std::uint32_t tail = load_acquire(&view.cq()->tail);
  check(tail == writer.tail());
  const std::uint32_t first = tail > l.cq_entries ? tail - l.cq_entries : 0;
  for (std::uint32_t i = first; i < tail; ++i) {
    const CompletionEntry& e = view.cqes()[i & (l.cq_entries - 1)];
    check(e.data_offset <= l.response_data_size && e.data_length <= l.response_data_size - e.data_offset);
    if (e.kind == static_cast<std::uint8_t>(Kind::tokens))
      check(std::uint64_t{e.count} * 4 + e.text_length == e.data_length);
  }
  check(writer.stats().written == tail);
  return 0;
}
