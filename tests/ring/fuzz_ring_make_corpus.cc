// Writes the seed corpus of fuzz_ring_consumer (tests/ring/corpus/ holds its output, checked in):
//   fuzz_ring_make_corpus DIR
// A handful of valid sessions in the fuzz_ring_input.h format, built with the real client (RingClient) so the
// entries and data are exactly what a client writes: submits with every option type, nops, cancels, a wrapped SQ,
// a full SQ, a CQ head that lets a backlog flush.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "fuzz_ring_input.h"
#include "ring/client_ring.h"
#include "ring/consumer.h"
#include "ring/layout.h"
#include "ring/record.h"

using namespace tandem::ring;
namespace fz = tandem::ring::fuzz;

namespace {

struct Session {
  int memfd = -1;
  std::uint8_t* base = nullptr;
  Layout layout;
  std::unique_ptr<RingClient> client;
  SubmissionConsumer consumer;
};

Session open_session() {
  Session s;
  s.layout = *compute_layout(fz::kRequest, {});
  s.memfd = ::memfd_create("corpus", MFD_CLOEXEC);
  if (s.memfd < 0 || ::ftruncate(s.memfd, static_cast<off_t>(s.layout.total_size)) != 0) std::exit(1);
  s.base = static_cast<std::uint8_t*>(
      ::mmap(nullptr, s.layout.total_size, PROT_READ | PROT_WRITE, MAP_SHARED, s.memfd, 0));
  initialize(s.base, s.layout);
  int sq[2], cq[2];
  if (::pipe2(sq, O_NONBLOCK) != 0 || ::pipe2(cq, O_NONBLOCK) != 0) std::exit(1);
  auto c = RingClient::attach(::dup(s.memfd), sq[1], cq[0]);
  if (!c) std::exit(1);
  s.client = std::move(*c);
  s.consumer = SubmissionConsumer(View{s.base, s.layout});
  return s;
}

void write_input(const Session& s, const std::string& path, std::uint32_t cq_head_1, std::uint32_t cq_head_2,
                 std::uint8_t max_knob, std::uint8_t backlog_knob) {
  const View v{s.base, s.layout};
  std::vector<std::uint8_t> in(fz::kMaxInput, 0);
  std::memcpy(in.data() + fz::kSqControlAt, v.sq(), sizeof(SqControl));
  std::memcpy(in.data() + fz::kCqHead1At, &cq_head_1, 4);
  std::memcpy(in.data() + fz::kCqHead2At, &cq_head_2, 4);
  in[fz::kKnobsAt] = max_knob;
  in[fz::kKnobsAt + 1] = backlog_knob;
  std::memcpy(in.data() + fz::kSqesAt, v.sqes(), 8 * sizeof(SubmissionEntry));
  std::memcpy(in.data() + fz::kRequestDataAt, v.request_data(), 4096);
  // Trailing zeros are what the fuzz target assumes for missing bytes: trim them (smaller seeds fuzz faster).
  while (in.size() > fz::kRequestDataAt && in.back() == 0) in.pop_back();
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(in.data()), static_cast<std::streamsize>(in.size()));
}

std::vector<std::uint8_t> full_request() {
  return RecordWriter()
      .add("model", "tiny")
      .add("prompt", "Hello, world")
      .add("max_tokens", std::uint64_t{16})
      .add("temperature", 0.7)
      .add("top_k", std::int64_t{40})
      .add("top_p", 0.9)
      .add("seed", std::uint64_t{42})
      .add("stop", std::vector<std::string>{"\n", "END"})
      .add("idempotency_key", "k-1")
      .add("allow_cpu", true)
      .add("stream", true)
      .add("resume_tokens", std::vector<std::int32_t>{1, 2, 3})
      .take();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  {  // one submit with every option type, a nop, a cancel
    Session s = open_session();
    (void)s.client->submit(1, full_request());
    (void)s.client->nop(2);
    (void)s.client->cancel(3, 77);
    write_input(s, dir + "/submit_nop_cancel", 3, 3, 0, 3);
  }
  {  // chat messages, small consume passes
    Session s = open_session();
    (void)s.client->submit(1, RecordWriter().add("model", "m")
                                  .add("messages", std::vector<std::string>{"system", "Be brief.", "user", "Hi"})
                                  .take());
    (void)s.client->submit(2, RecordWriter().add("model", "m").add("prompt", "x").add("deadline_ms", std::uint64_t{500}).take());
    write_input(s, dir + "/messages_two_submits", 1, 2, 1, 1);
  }
  {  // a full SQ of nops
    Session s = open_session();
    for (int i = 0; i < 8; ++i) (void)s.client->nop(100 + i);
    write_input(s, dir + "/full_sq_nops", 4, 8, 3, 0);
  }
  {  // tail 11, shared head 6: the fuzz target's consumer starts at 0, so this seeds the sq_index path
    Session s = open_session();
    for (int i = 0; i < 6; ++i) (void)s.client->submit(i, RecordWriter().add("prompt", std::string_view("p" + std::to_string(i))).add("model", "m").take());
    (void)s.consumer.consume(64);
    for (int i = 0; i < 5; ++i) (void)s.client->submit(10 + i, RecordWriter().add("prompt", "wrapped prompt").add("model", "m").take());
    write_input(s, dir + "/tail_ahead_of_head", 0, 0, 0, 2);
  }
  {  // a long prompt (many token batches, backlog, drops with a small limit)
    Session s = open_session();
    (void)s.client->submit(9, RecordWriter().add("model", "m").add("prompt", std::string_view(std::string(900, 'a'))).take());
    write_input(s, dir + "/long_prompt_backlog", 5, 8, 0, 1);
  }
  {  // an option with the wrong type (request_from_record error path)
    Session s = open_session();
    (void)s.client->submit(4, RecordWriter().add("model", "m").add("prompt", "p").add("max_tokens", "ten").take());
    write_input(s, dir + "/bad_option_type", 1, 1, 0, 3);
  }
  {  // embeds (ABI 1.1): texts + images + every option, a text-only one, and one with a wrong type
    Session s = open_session();
    (void)s.client->embed(1, RecordWriter()
                                 .add("model", "emb")
                                 .add("texts", std::vector<std::string>{"a red circle", "two blue squares"})
                                 .add("images", ByteList{{0x89, 'P', 'N', 'G', 13, 10, 26, 10}, {0xff, 0xd8, 0xff}})
                                 .add("idempotency_key", "e-1")
                                 .add("allow_cpu", true)
                                 .add("deadline_ms", std::uint64_t{5000})
                                 .add("truncate", false)
                                 .take());
    (void)s.client->embed(2, RecordWriter().add("texts", std::vector<std::string>{"x"}).take());
    (void)s.client->embed(3, RecordWriter().add("texts", "not a list").take());
    (void)s.client->nop(4);
    write_input(s, dir + "/embed_texts_images", 4, 4, 0, 3);
  }
  {  // transcribe (ABI 1.2): a stream's format, two audio chunks (the second at a wrong offset, then the end), a file
    Session s = open_session();
    (void)s.client->transcribe(1, RecordWriter()
                                      .add("model", "asr")
                                      .add("stream", true)
                                      .add("sample_rate", std::uint64_t{8000})
                                      .add("channels", std::uint64_t{2})
                                      .add("sample_format", "s16le")
                                      .add("language", "en")
                                      .take());
    (void)s.client->audio(2, 3, RecordWriter().add("offset", std::uint64_t{0}).add("pcm", ByteList{{1, 0, 2, 0, 3, 0, 4, 0}}).take());
    (void)s.client->audio(3, 3, RecordWriter().add("offset", std::uint64_t{4}).add("pcm", ByteList{{1, 0, 2, 0}}).take());
    (void)s.client->audio(4, 3, RecordWriter().add("offset", std::uint64_t{8}).add("end", true).take());
    (void)s.client->transcribe(5, RecordWriter().add("audio", ByteList{{'R', 'I', 'F', 'F', 0, 0, 0, 0}}).take());
    write_input(s, dir + "/transcribe_stream_chunks", 5, 5, 0, 3);
  }
  return 0;
}
