// The real Backend (backend.h): tandemd through the client library, on a thread of its own. One D-Bus connection
// for control and views (ListModels, GetAll, GetJob, Cancel, Resume) and one ring session for the data path
// (submissions, embeddings and their events, docs/rings.md). The gateway's I/O thread hands it commands through a
// queue and an eventfd; results go back through `post` (the I/O thread's executor). It watches tandemd's bus name:
// when the owner changes or vanishes (tandemd restarted or stopped), every open job is reported lost (its client
// gets a resumable error naming the job) and the link reconnects.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "client/client.h"
#include "http/backend.h"

namespace tandem::http {

class TandemLink : public Backend {
 public:
  struct Options {
    client::BusSpec bus;
    std::string service = client::kServiceName;
    std::chrono::milliseconds reconnect_interval{500};
    std::chrono::milliseconds owner_check_interval{500};
    std::uint64_t request_data_bytes = 16u << 20;  // the ring's request area: an embed of images must fit
    std::uint32_t ring_entries = 1024;
  };
  using Post = std::function<void(std::function<void()>)>;

  TandemLink(Options options, Post post);
  ~TandemLink() override;  // stops the thread
  TandemLink(const TandemLink&) = delete;
  TandemLink& operator=(const TandemLink&) = delete;

  void start();
  // Waits up to `timeout` for the first connection (for READY=1 after tandemd is reachable).
  bool wait_connected(std::chrono::milliseconds timeout);

  void submit(const client::Request& r, std::shared_ptr<JobSink> sink) override;
  void resume(std::uint64_t job, const client::SubmitOptions& overrides, std::shared_ptr<JobSink> sink) override;
  void transcribe(const client::TranscribeRequest& r, std::shared_ptr<JobSink> sink) override;
  void transcribe_stream(const client::TranscribeRequest& r, std::shared_ptr<JobSink> sink) override;
  void audio(std::uint64_t job, std::string pcm, bool end) override;
  void cancel(std::uint64_t job) override;
  void embed(const client::EmbedRequest& r, std::function<void(Outcome<client::EmbedReply>)> done) override;
  void models(std::function<void(Outcome<std::vector<ModelEntry>>)> done) override;
  void status(std::function<void(Outcome<client::ServiceStatus>)> done) override;
  void get_job(std::uint64_t job, std::function<void(Outcome<client::JobInfo>)> done) override;
  bool connected() const override { return connected_.load(); }

  struct State;  // the thread's own state (tandem_link.cc)

 private:
  void command(std::function<void(State&)> fn);
  void run();
  // Drops `keep` on the thread that runs post_'s functions (the Asio thread). The sinks and callbacks the link thread
  // holds belong to the gateway's objects (flows, connections): their last reference must not go here, where their
  // destructors would race with the Asio thread (ThreadSanitizer found a Wyoming connection destroyed on the link
  // thread by a callback's last copy). So the link moves what it drops into a post, never copies and destroys it.
  template <class T>
  void release(T&& keep) {
    post_([k = std::forward<T>(keep)] {});
  }

  Options opt_;
  Post post_;
  int wake_fd_ = -1;
  std::mutex mu_;
  std::vector<std::function<void(State&)>> commands_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> connected_{false};
  std::thread thread_;
};

}  // namespace tandem::http
