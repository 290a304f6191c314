// Service: the generate workload — text generation's part of the scheduler (docs/architecture.md): tokenizing for
// the serving model, the run on a route's step loop with token events, failover by the FailoverPolicy, and what
// the end of a job keeps (a failed job keeps its request and checkpoint for Resume).
#include "daemon/service.h"

#include "daemon/service_internal.h"

namespace tandem::daemon {

bool Service::GenerateWorkload::start(Service& s, JobRecord& j) {
  const std::string& serving = j.route.model;
  // The chunk the step loop cuts this job's prompt into (engine::BatchLimits::chunk_for), for the queue's ETAs.
  {
    policy::JobQueue& q = j.route.device == policy::Device::cpu ? s.cpu_queue_ : s.gpu_queue_;
    const auto& qc = q.config();
    std::uint32_t chunk = qc.step_tokens >= qc.concurrency ? qc.step_tokens - qc.concurrency + 1 : 1;
    if (j.prefill_chunk > 0) chunk = std::min(chunk, j.prefill_chunk);
    q.set_prefill_chunk(j.id, chunk);
  }
  RunSpec spec;
  spec.job = j.id;
  spec.route = j.route;
  spec.prompt = j.prompts[serving];
  spec.sampling = j.sampling;
  spec.max_new_tokens = j.max_new_tokens;
  spec.stop = j.stop;
  spec.resume_tokens = j.tokens;
  spec.prefill_chunk = j.prefill_chunk;
  auto cancel = j.cancel;
  const auto attempt = j.attempt;
  const auto flush = std::chrono::duration_cast<Clock::duration>(s.cfg_.runtime.token_flush_interval);
  Service* self = &s;
  auto task = [self, spec = std::move(spec), cancel, attempt, flush] {
    Sink sink(self, spec.job, attempt, flush);
    RunResult r = self->backend_->run(spec, sink, *cancel);
    sink.flush();
    WorkerEvent ev;
    ev.kind = WorkerEvent::finished;
    ev.job = spec.job;
    ev.attempt = attempt;
    ev.result = std::move(r);
    self->post(std::move(ev));
  };
  (j.route.device == policy::Device::cpu ? s.cpu_pool_ : s.gpu_pool_)->post(std::move(task));
  return true;
}

Status Service::GenerateWorkload::completed(Service& s, JobRecord& j, const RunResult& r) {
  (void)s, (void)j, (void)r;  // the tokens arrived as events and were checkpointed; nothing more to keep
  return {};
}

// Before the first token the CPU simply runs it again; after tokens the checkpoint moves to the CPU when sampling
// is reproducible there and the client does not act on tokens (side_effects); else it fails resumable.
policy::FailoverDecision Service::GenerateWorkload::failover(const Service& s, const JobRecord& j) const {
  policy::FailoverInput in;
  in.tokens_delivered = static_cast<std::uint32_t>(j.tokens.size() - j.resume.size());
  in.sampling_reproducible = true;  // counter-based RNG keyed by (seed, step); CPU replica has the same fingerprint
  in.side_effects = j.side_effects;
  in.cpu_route_available = s.cpu_can_serve(j);
  return s.failover_.decide(in);
}

void Service::GenerateWorkload::ended(Service& s, JobRecord& j, JobPhase phase, Errc code, const std::string& message) {
  (void)s, (void)code, (void)message;
  if (phase != JobPhase::failed) {  // nothing can resume it: the prompt need not stay in memory
    j.prompts.clear();
    j.req.prompt.clear();
    j.req.prompt.shrink_to_fit();
    j.req.messages.clear();
    j.request_json = json();
  }
}

void Service::GenerateWorkload::outcome(const JobRecord& j, Dict& fin) const {
  fin["tokens_total"] = static_cast<std::uint32_t>(j.tokens.size());
  fin["text"] = j.text;
}

void Service::GenerateWorkload::view(const JobRecord& j, Dict& d) const {
  (void)j;
  d["kind"] = std::string("generate");
}

}  // namespace tandem::daemon
