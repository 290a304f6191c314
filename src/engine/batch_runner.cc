#include "engine/batch_runner.h"

#include <algorithm>
#include <chrono>

namespace tandem::engine {

namespace {
using SteadyClock = std::chrono::steady_clock;
double ms_between(SteadyClock::time_point a, SteadyClock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}
}  // namespace

Status BatchLimits::validate() const {
  if (max_batch < 1 || max_batch > 1024) return fail(Errc::invalid_argument, "max_batch must be in [1, 1024]");
  if (step_tokens < 1) return fail(Errc::invalid_argument, "step_tokens must be >= 1");
  if (prefill_chunk < 0) return fail(Errc::invalid_argument, "prefill_chunk must be >= 0");
  return {};
}

int BatchLimits::chunk_for(const GenerateRequest& r) const {
  int c = prefill_chunk > 0 ? prefill_chunk : std::max(1, step_tokens - max_batch + 1);
  if (r.prefill_chunk > 0) c = std::min(c, r.prefill_chunk);
  return c;
}

BatchRunner::BatchRunner(std::shared_ptr<Model> model, BatchLimits limits, std::function<void(const StepStats&)> on_step)
    : model_(std::move(model)), limits_(limits), on_step_(std::move(on_step)) {
  thread_ = std::thread([this] { loop(); });
}

BatchRunner::~BatchRunner() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

Status BatchRunner::submit(std::unique_ptr<Generation> g, Callbacks cb, const std::atomic<bool>* cancel) {
  if (!g) return fail(Errc::invalid_argument, "submit: no generation");
  Member m;
  m.chunk = limits_.chunk_for(g->request());
  m.gen = std::move(g);
  m.cb = std::move(cb);
  m.cancel = cancel;
  {
    std::lock_guard lock(mu_);
    if (stopping_) return fail(Errc::unavailable, "the batch runner is stopping");
    waiting_.push_back(std::move(m));
  }
  cv_.notify_all();
  return {};
}

std::size_t BatchRunner::active() const {
  std::lock_guard lock(mu_);
  return waiting_.size() + running_count_;
}

void BatchRunner::end(Member& m, const Status& st) {
  if (std::string tail = m.gen->take_text(); !tail.empty() && m.cb.token) {
    TokenEvent ev;
    ev.token = -1;
    ev.step = m.gen->tokens().size();
    ev.text = std::move(tail);
    m.cb.token(ev);
  }
  if (m.cb.finished) m.cb.finished(m.gen->finish_reason(), st);
}

void BatchRunner::loop() {
  Model::init_compute_thread();
  std::vector<Member> running;
  for (;;) {
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !waiting_.empty() || !running.empty(); });
      if (stopping_) {
        for (auto& m : waiting_) running.push_back(std::move(m));
        waiting_.clear();
        running_count_ = running.size();
        lock.unlock();
        for (auto& m : running) {
          m.gen->cancel();
          end(m, {});
        }
        std::lock_guard relock(mu_);
        running_count_ = 0;
        return;
      }
      // Cancelled while waiting for a slot: they end now, without taking one.
      for (auto it = waiting_.begin(); it != waiting_.end();) {
        if (it->cancel && it->cancel->load(std::memory_order_relaxed)) {
          it->gen->cancel();
          running.push_back(std::move(*it));  // ended by the step below (finished, not in the batch)
          it = waiting_.erase(it);
        } else {
          ++it;
        }
      }
      while (!waiting_.empty() && static_cast<int>(running.size()) < limits_.max_batch) {
        running.push_back(std::move(waiting_.front()));
        waiting_.pop_front();
      }
      running_count_ = running.size();
    }
    step(running);
    std::lock_guard lock(mu_);
    running_count_ = running.size();
  }
}

void BatchRunner::step(std::vector<Member>& running) {
  const auto t0 = SteadyClock::now();
  // Cancellations, and generations that are already complete (a checkpoint that ends at once).
  for (auto& m : running) {
    if (m.gen->finished()) continue;
    if (m.cancel && m.cancel->load(std::memory_order_relaxed)) m.gen->cancel();
  }
  // The batch: every decoding sequence (one token each), then prompt chunks in arrival order while they fit.
  std::vector<Model::BatchItem> items;
  std::vector<std::size_t> who;
  int budget = limits_.step_tokens;
  for (int pass = 0; pass < 2; ++pass) {
    for (std::size_t i = 0; i < running.size(); ++i) {
      Member& m = running[i];
      if (m.gen->finished() || m.gen->prefilling() != (pass == 1)) continue;
      const std::span<const TokenId> in = m.gen->next_input(m.chunk);
      if (in.empty()) continue;
      const int n = static_cast<int>(in.size());
      // A decode token always goes (the batch is at most max_batch and a chunk leaves room for them); a chunk that
      // does not fit waits for the next step, except that a step never goes empty.
      if (pass == 1 && n > budget && !items.empty()) continue;
      items.push_back({&m.gen->sequence(), in, false});
      who.push_back(i);
      budget -= n;
    }
  }
  StepStats st;
  if (!items.empty()) {
    st.batch = static_cast<int>(items.size());
    std::vector<bool> was_prefilling(items.size());
    for (std::size_t k = 0; k < items.size(); ++k) {
      was_prefilling[k] = running[who[k]].gen->prefilling();
      st.tokens += static_cast<int>(items[k].tokens.size());
      if (was_prefilling[k]) st.prefill_tokens += static_cast<int>(items[k].tokens.size());
    }
    auto out = model_->forward_batch(items);
    // Reported before any member hears of its end, so that once every caller has its last event no report of
    // this runner is still to come.
    const auto forward_end = SteadyClock::now();
    st.ms = ms_between(t0, forward_end);
    st.after_ms = last_after_ms_;
    last_after_ms_ = 0;
    steps_.fetch_add(1);
    if (on_step_) on_step_(st);
    if (!out) {
      // The step failed as a whole: every member of it ends with the error (each caller fails over on its own).
      const Status err = fail(out.error());
      for (std::size_t k = 0; k < items.size(); ++k) {
        Member& m = running[who[k]];
        m.gen->fail_step();
        end(m, err);
      }
    } else {
      for (std::size_t k = 0; k < items.size(); ++k) {
        Member& m = running[who[k]];
        auto& r = (*out)[k];
        if (!r) {
          m.gen->fail_step();
          end(m, fail(std::move(r).error()));
          continue;
        }
        auto ev = m.gen->advance(m.chunk, std::move(r).value());
        if (was_prefilling[k] && !m.gen->prefilling() && !m.announced) {
          m.announced = true;
          m.prefill_ms += ms_between(t0, SteadyClock::now());
          if (m.cb.prefilled) m.cb.prefilled(static_cast<std::uint32_t>(m.gen->stats().prompt_tokens), m.prefill_ms);
        } else if (was_prefilling[k]) {
          m.prefill_ms += ms_between(t0, SteadyClock::now());
        }
        if (ev && m.cb.token) m.cb.token(*ev);
        if (m.gen->finished()) end(m, {});
      }
    }
    last_after_ms_ = ms_between(forward_end, SteadyClock::now());
  }
  // Members that finished without running in this step (cancelled, complete checkpoint) also end.
  for (auto& m : running) {
    const bool in_step = std::find_if(who.begin(), who.end(), [&](std::size_t i) { return &running[i] == &m; }) != who.end();
    if (!in_step && m.gen->finished()) end(m, {});
  }
  running.erase(std::remove_if(running.begin(), running.end(), [](const Member& m) { return m.gen->finished(); }),
                running.end());
}

}  // namespace tandem::engine
