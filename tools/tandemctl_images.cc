// tandemctl index / search: image search over tandemd's embedding models (docs/image-search.md). The vectors come
// from Embed, the index is a SQLite file (src/client/image_index.h).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "client/image_index.h"
#include "tandemctl_common.h"

namespace tandemctl {

namespace {

constexpr int kIndexError = 5;  // the index file cannot be used (corrupt, another model): docs/tandemctl.md
constexpr int kMaxRetries = 100;

// An fd closed on scope exit.
struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(std::exchange(o.fd, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    std::swap(fd, o.fd);
    return *this;
  }
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

struct EmbedModel {
  tc::IndexIdentity id;
};

// --model M, else the first ListModels entry of kind "embedding". nullopt: rc is set (message printed).
std::optional<EmbedModel> pick_model(const Global& g, tc::Client& c, const std::optional<std::string>& want, int& rc) {
  auto models = c.list_models();
  if (!models.ok()) {
    rc = bus_error(g, models.error(), c.last_error());
    return std::nullopt;
  }
  const tc::ModelInfo* m = nullptr;
  for (const auto& x : *models) {
    if (want ? x.name.value_or("") == *want : x.kind.value_or("") == "embedding") {
      m = &x;
      break;
    }
  }
  auto refuse = [&](const std::string& msg) {
    rc = bus_error(g, tandem::Error{want ? tandem::Errc::not_found : tandem::Errc::unsupported, msg});
    return std::nullopt;
  };
  if (!m) {
    if (want) return refuse("tandemd has no model named '" + *want + "'");
    return refuse("tandemd has no embedding model (tandemctl models lists the configured ones)");
  }
  if (m->kind.value_or("llm") != "embedding")
    return refuse("model '" + m->name.value_or("") + "' is not an embedding model (kind " + m->kind.value_or("llm") +
                  ")");
  if (!m->dim || *m->dim == 0) return refuse("model '" + m->name.value_or("") + "' has no vector width (dim)");
  return EmbedModel{{m->name.value_or(""), m->fingerprint.value_or(""), *m->dim}};
}

// The index file's errors: what to do about them.
int index_error(const Global& g, const tandem::Error& e, const std::string& rebuild_hint) {
  err_line("tandemctl: " + e.message);
  if (e.code == tandem::Errc::format_error || e.code == tandem::Errc::incompatible)
    err_line("tandemctl: rebuild it with: " + rebuild_hint);
  if (g.json) out_json({{"event", "error"}, {"error", error_json(e, std::nullopt)}});
  return kIndexError;
}

bool interrupted_now() {
  bool hit = false;
  for (int s : tc::take_interrupts()) hit = hit || s != 0;
  return hit;
}

struct EmbedOutcome {
  std::optional<tc::EmbedReply> reply;
  tandem::Error error;
  std::optional<tc::RemoteError> remote;
  bool interrupted = false;
  bool invalid_input() const { return remote && remote->short_name() == "InvalidArgument"; }
};

// One Embed call; Busy/QueueFull/HostMemory wait retry_after_ms and go again. The fds are rewound before each try:
// the daemon reads them from their offset, and it shares that offset with us.
EmbedOutcome embed_retrying(tc::Client& c, const tc::EmbedRequest& req) {
  EmbedOutcome out;
  for (int attempt = 0;; ++attempt) {
    for (int fd : req.image_fds) ::lseek(fd, 0, SEEK_SET);
    auto r = c.embed(req);
    if (r.ok()) {
      out.reply = std::move(r).value();
      return out;
    }
    out.error = r.error();
    out.remote = c.last_error();
    const std::string name = out.remote ? out.remote->short_name() : "";
    const bool retry = name == "Busy" || name == "QueueFull" || name == "HostMemory";
    if (!retry || attempt >= kMaxRetries) return out;
    const std::uint64_t wait_ms = std::clamp<std::uint64_t>(out.remote->retry_after_ms.value_or(1000), 50, 60000);
    for (std::uint64_t waited = 0; waited < wait_ms; waited += 100) {
      if (interrupted_now()) {
        out.interrupted = true;
        return out;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min<std::uint64_t>(100, wait_ms - waited)));
    }
  }
}

std::string rebuild_command(const Global& g, const std::string& dir, const std::optional<std::string>& index_flag) {
  std::string c = g.prefix() + " index " + (dir.empty() ? std::string("DIR") : dir) + " --rebuild";
  if (index_flag) c += " --index " + *index_flag;
  return c;
}

// Progress: a bar on a TTY (stderr), a line every 5 s otherwise, JSON events with --json.
class Progress {
 public:
  Progress(const Global& g, std::size_t total) : g_(g), total_(total), tty_(::isatty(2) == 1) {}
  void update(std::size_t done, double rate, bool final = false) {
    auto now = std::chrono::steady_clock::now();
    if (g_.json) {
      out_json({{"event", "progress"}, {"done", done}, {"total", total_}, {"images_per_s", rate}});
      return;
    }
    if (total_ == 0) return;
    char eta[32] = "";
    if (rate > 0 && done < total_)
      std::snprintf(eta, sizeof eta, "  eta %s",
                    tc::format_duration_ms(static_cast<std::uint64_t>((total_ - done) / rate * 1000)).c_str());
    const double frac = static_cast<double>(done) / static_cast<double>(total_);
    char buf[256];
    if (tty_) {
      const int width = 30, fill = static_cast<int>(frac * width);
      std::string bar = std::string(fill, '#') + std::string(width - fill, '.');
      std::snprintf(buf, sizeof buf, "\r[%s] %zu/%zu %3.0f%%  %.1f images/s%s\033[K", bar.c_str(), done, total_,
                    frac * 100, rate, eta);
      std::fputs(buf, stderr);
      if (final) std::fputs("\n", stderr);
      std::fflush(stderr);
    } else if (final || now - last_ >= std::chrono::seconds(5)) {
      std::snprintf(buf, sizeof buf, "indexed %zu/%zu (%.0f%%), %.1f images/s%s", done, total_, frac * 100, rate, eta);
      err_line(buf);
      last_ = now;
    }
  }
  // A message while a bar is shown: on its own line.
  void note(const std::string& s) {
    if (tty_ && !g_.json) std::fputs("\r\033[K", stderr);
    err_line(s);
  }

 private:
  const Global& g_;
  std::size_t total_;
  bool tty_;
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

}  // namespace

int cmd_index(Global& g, ArgList& a) {
  std::optional<std::string> dir, model, index_flag;
  bool rebuild = false;
  std::size_t batch = 16;
  while (!a.done()) {
    std::string f = a.next();
    if (f == "--json")
      g.json = true;
    else if (f == "--model")
      model = a.value(f);
    else if (f == "--index")
      index_flag = a.value(f);
    else if (f == "--rebuild")
      rebuild = true;
    else if (f == "--batch")
      batch = tandem::cli::parse_number<std::size_t>(f, a.value(f), 1, 1024);
    else if (!dir && !f.empty() && f[0] != '-')
      dir = f;
    else
      throw ArgError{"index: unexpected argument " + f};
  }
  if (!dir) throw ArgError{"index: DIR is missing"};
  std::string file;
  if (index_flag) {
    file = *index_flag;
  } else {
    auto p = tc::default_index_path();
    if (!p.ok()) throw ArgError{"index: " + p.error().message};
    file = *p;
  }
  if (auto s = tc::install_interrupt_handler(kCancelled); !s.ok()) return bus_error(g, s.error());

  int rc = kOk;
  auto c = open_client(g, rc);
  if (!c) return rc;
  auto em = pick_model(g, *c, model, rc);
  if (!em) return rc;
  auto opened = tc::ImageIndex::open(file, em->id, {.create = true, .rebuild = rebuild});
  if (!opened.ok()) return index_error(g, opened.error(), rebuild_command(g, *dir, index_flag));
  auto& ix = *opened.value();
  auto plan = ix.plan_update(*dir);
  if (!plan.ok()) {
    err_line("tandemctl: index: " + plan.error().message);
    if (g.json) out_json({{"event", "error"}, {"error", error_json(plan.error(), std::nullopt)}});
    return plan.error().code == tandem::Errc::format_error ? kIndexError : kUsage;
  }
  for (const auto& p : plan->problems) {
    err_line("tandemctl: warning: " + p.path + ": " + p.message);
    if (g.json) out_json({{"event", "warning"}, {"path", p.path}, {"message", p.message}});
  }
  if (auto r = ix.remove(plan->removed); !r.ok()) return index_error(g, r.error(), rebuild_command(g, *dir, index_flag));

  const std::vector<tc::FileStamp> work = plan->to_embed();
  std::set<std::string> changed;
  for (const auto& f : plan->changed) changed.insert(f.path);
  std::uint64_t added = 0, updated = 0, failed = 0, vanished = 0;
  std::size_t done = 0;
  const auto t0 = std::chrono::steady_clock::now();
  auto rate = [&] {
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return s > 0 ? static_cast<double>(done) / s : 0.0;
  };
  Progress progress(g, work.size());
  int exit_code = kOk;
  bool stop = false;

  for (std::size_t at = 0; at < work.size() && !stop;) {
    const std::size_t n = std::min(batch, work.size() - at);
    // Open the batch's files (never through a symlink); the stamp stored is the opened file's own.
    std::vector<tc::FileStamp> files;
    std::vector<Fd> fds;
    for (std::size_t i = at; i < at + n; ++i) {
      const auto& w = work[i];
      Fd fd(::open(w.path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY));
      struct stat st {};
      if (fd.fd < 0 || ::fstat(fd.fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        const int e = errno;
        ++done;
        if (fd.fd < 0 && e == ENOENT) {
          ++vanished;  // removed since the scan: the next run drops any row it had
          continue;
        }
        ++failed;
        std::string why = fd.fd < 0 ? std::string("cannot open: ") + std::strerror(e) : "not a regular file";
        progress.note("tandemctl: skipped " + w.path + ": " + why);
        if (g.json) out_json({{"event", "failed"}, {"path", w.path}, {"message", why}});
        continue;
      }
      files.push_back({w.path, static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec,
                       static_cast<std::uint64_t>(st.st_size)});
      fds.push_back(std::move(fd));
    }
    at += n;
    if (files.empty()) continue;

    std::vector<tc::IndexUpdate> updates;
    auto request = [&](std::size_t from, std::size_t count) {
      tc::EmbedRequest r;
      r.model = em->id.model;
      for (std::size_t i = from; i < from + count; ++i) r.image_fds.push_back(fds[i].fd);
      return r;
    };
    auto fatal = [&](const EmbedOutcome& o) {
      progress.note("");
      exit_code = o.interrupted ? kCancelled : bus_error(g, o.error, o.remote);
      if (o.interrupted) err_line("tandemctl: interrupted");
      stop = true;
    };
    EmbedOutcome whole = embed_retrying(*c, request(0, files.size()));
    if (whole.reply) {
      for (std::size_t i = 0; i < files.size(); ++i) updates.push_back({files[i], whole.reply->vectors[i], ""});
    } else if (whole.invalid_input()) {
      // The daemon refuses the whole call for one bad input: find it (them) one by one.
      std::size_t bad = 0;
      for (std::size_t i = 0; i < files.size() && !stop; ++i) {
        EmbedOutcome one = files.size() == 1 ? whole : embed_retrying(*c, request(i, 1));
        if (one.reply) {
          updates.push_back({files[i], one.reply->vectors[0], ""});
        } else if (one.invalid_input()) {
          ++bad;
          updates.push_back({files[i], {}, one.remote->message});
          progress.note("tandemctl: skipped " + files[i].path + ": " + one.remote->message);
          if (g.json) out_json({{"event", "failed"}, {"path", files[i].path}, {"message", one.remote->message}});
        } else {
          fatal(one);
        }
      }
      if (!stop && bad == 0 && batch > 1) {
        // Every image was fine alone: the batch itself was refused (more inputs than max_inputs?).
        batch = std::max<std::size_t>(1, batch / 2);
        progress.note("tandemctl: note: the daemon refused a batch of " + std::to_string(files.size()) +
                      " (" + whole.remote->message + "); batches of " + std::to_string(batch) + " from now on");
      }
    } else {
      fatal(whole);
    }
    // What was embedded is kept even when the run stops here.
    if (auto r = ix.apply(updates); !r.ok()) {
      progress.note("");
      return index_error(g, r.error(), rebuild_command(g, *dir, index_flag));
    }
    for (const auto& u : updates) {
      ++done;
      if (!u.error.empty())
        ++failed;
      else if (changed.count(u.file.path))
        ++updated;
      else
        ++added;
    }
    if (!stop && interrupted_now()) {
      progress.note("tandemctl: interrupted");
      exit_code = kCancelled;
      stop = true;
    }
    if (!stop) progress.update(done, rate());
  }
  if (!stop && !work.empty()) progress.update(done, rate(), true);

  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::uint64_t embedded = added + updated;
  const double per_s = secs > 0 ? static_cast<double>(embedded) / secs : 0.0;
  auto counts = ix.counts();
  if (g.json) {
    json s = {{"event", "summary"},
              {"index", ix.file()},
              {"model", em->id.model},
              {"root", plan->root},
              {"added", added},
              {"updated", updated},
              {"unchanged", plan->unchanged},
              {"removed", plan->removed.size()},
              {"failed", failed},
              {"known_failures", plan->known_failures},
              {"vanished", vanished},
              {"skipped_symlinks", plan->skipped_symlinks},
              {"seconds", secs},
              {"images_per_s", per_s},
              {"complete", !stop}};
    if (counts.ok()) s["indexed"] = counts->images;
    out_json(s);
  } else {
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "%s: added %llu, updated %llu, unchanged %llu, removed %zu, failed %llu%s in %.1f s (%.1f images/s)\n",
                  plan->root.c_str(), static_cast<unsigned long long>(added), static_cast<unsigned long long>(updated),
                  static_cast<unsigned long long>(plan->unchanged), plan->removed.size(),
                  static_cast<unsigned long long>(failed),
                  plan->known_failures
                      ? (" (+" + std::to_string(plan->known_failures) + " known failures not retried)").c_str()
                      : "",
                  secs, per_s);
    out_text(buf);
    if (counts.ok())
      out_text(ix.file() + ": " + std::to_string(counts->images) + " images, model " + em->id.model + "\n");
  }
  return exit_code;
}

int cmd_search(Global& g, ArgList& a) {
  std::optional<std::string> text, image, model, index_flag;
  std::size_t n = 10;
  while (!a.done()) {
    std::string f = a.next();
    if (f == "--json")
      g.json = true;
    else if (f == "--image")
      image = a.value(f);
    else if (f == "-n" || f == "--count")
      n = tandem::cli::parse_number<std::size_t>(f, a.value(f), 1, 100000);
    else if (f == "--model")
      model = a.value(f);
    else if (f == "--index")
      index_flag = a.value(f);
    else if (f == "--")
      text = a.done() ? std::string() : a.next();
    else if (!text && (f.empty() || f[0] != '-'))
      text = f;
    else
      throw ArgError{"search: unexpected argument " + f};
  }
  if (text && image) throw ArgError{"search: give a TEXT or --image FILE, not both"};
  if (!text && !image) throw ArgError{"search: TEXT or --image FILE is missing"};
  if (text && text->empty()) throw ArgError{"search: the TEXT is empty"};
  std::string file;
  if (index_flag) {
    file = *index_flag;
  } else {
    auto p = tc::default_index_path();
    if (!p.ok()) throw ArgError{"search: " + p.error().message};
    file = *p;
  }
  Fd image_fd;
  if (image) {
    image_fd = Fd(::open(image->c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY));
    if (image_fd.fd < 0) throw ArgError{"search: --image " + *image + ": " + std::strerror(errno)};
  }
  if (auto s = tc::install_interrupt_handler(kCancelled); !s.ok()) return bus_error(g, s.error());

  int rc = kOk;
  auto c = open_client(g, rc);
  if (!c) return rc;
  auto em = pick_model(g, *c, model, rc);
  if (!em) return rc;
  auto opened = tc::ImageIndex::open(file, em->id, {.create = false});
  if (!opened.ok()) {
    if (opened.error().code == tandem::Errc::not_found) {
      err_line("tandemctl: " + opened.error().message);
      if (g.json) out_json({{"event", "error"}, {"error", error_json(opened.error(), std::nullopt)}});
      return kIndexError;
    }
    return index_error(g, opened.error(), rebuild_command(g, "", index_flag));
  }
  auto& ix = *opened.value();

  tc::EmbedRequest req;
  req.model = em->id.model;
  if (text)
    req.texts.push_back(*text);
  else
    req.image_fds.push_back(image_fd.fd);
  EmbedOutcome q = embed_retrying(*c, req);
  if (!q.reply) {
    if (q.interrupted) return kCancelled;
    return bus_error(g, q.error, q.remote);
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto hits = ix.search(q.reply->vectors.at(0), n);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (!hits.ok()) return index_error(g, hits.error(), rebuild_command(g, "", index_flag));
  if (g.json) {
    json arr = json::array();
    for (std::size_t i = 0; i < hits->size(); ++i)
      arr.push_back({{"rank", i + 1}, {"score", (*hits)[i].score}, {"path", (*hits)[i].path}});
    json j = {{"model", em->id.model}, {"index", ix.file()}, {"search_ms", ms}, {"results", arr}};
    if (text) j["text"] = *text;
    if (image) j["image"] = *image;
    out_json(j);
    return kOk;
  }
  if (hits->empty()) {
    err_line("tandemctl: the index " + ix.file() + " has no images: run 'tandemctl index DIR' first");
    return kOk;
  }
  std::string out = "RANK  SCORE   PATH\n";
  char buf[64];
  for (std::size_t i = 0; i < hits->size(); ++i) {
    std::snprintf(buf, sizeof buf, "%4zu  %6.4f  ", i + 1, static_cast<double>((*hits)[i].score));
    out += buf + (*hits)[i].path + "\n";
  }
  out_text(out);
  return kOk;
}

// tandemctl embed [--model M] [--image FILE]... [--image-bytes FILE]... [--key K] [--no-cpu] [--no-truncate]
//                 [--deadline-ms N] [--] [TEXT]...: one Embed call; the vectors on stdout (one line each, in the
// daemon's order: texts, then --image files, then --image-bytes files), what ran where on stderr.
int cmd_embed(Global& g, ArgList& a) {
  tc::EmbedRequest req;
  std::vector<std::string> image_paths, byte_paths;
  while (!a.done()) {
    std::string f = a.next();
    if (f == "--json")
      g.json = true;
    else if (f == "--model")
      req.model = a.value(f);
    else if (f == "--image")
      image_paths.push_back(a.value(f));
    else if (f == "--image-bytes")
      byte_paths.push_back(a.value(f));
    else if (f == "--key")
      req.options.idempotency_key = a.value(f);
    else if (f == "--no-cpu")
      req.options.allow_cpu = false;
    else if (f == "--no-truncate")
      req.options.truncate = false;
    else if (f == "--deadline-ms")
      req.options.deadline_ms = tandem::cli::parse_number<std::uint64_t>(f, a.value(f), 1, 7ull * 24 * 3600 * 1000);
    else if (f == "--") {
      while (!a.done()) req.texts.push_back(a.next());
    } else if (!f.empty() && f[0] == '-')
      throw ArgError{"embed: unknown option " + f};
    else
      req.texts.push_back(f);
  }
  if (req.texts.empty() && image_paths.empty() && byte_paths.empty())
    throw ArgError{"embed: give TEXT arguments, --image FILE or --image-bytes FILE"};
  std::vector<Fd> fds;
  for (const auto& p : image_paths) {
    // No O_NOFOLLOW here: the user named the file. A pipe or socket is the daemon's to refuse (regular files only).
    Fd fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY));
    if (fd.fd < 0) throw ArgError{"embed: --image " + p + ": " + std::strerror(errno)};
    req.image_fds.push_back(fd.fd);
    fds.push_back(std::move(fd));
  }
  for (const auto& p : byte_paths) {
    Fd fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY));
    if (fd.fd < 0) throw ArgError{"embed: --image-bytes " + p + ": " + std::strerror(errno)};
    std::vector<std::uint8_t> bytes;
    std::uint8_t buf[65536];
    for (;;) {
      const ssize_t n = ::read(fd.fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw ArgError{"embed: --image-bytes " + p + ": " + std::strerror(errno)};
      if (n == 0) break;
      bytes.insert(bytes.end(), buf, buf + n);
      if (bytes.size() > (1ull << 30)) throw ArgError{"embed: --image-bytes " + p + ": over 1 GiB"};
    }
    req.images.push_back(std::move(bytes));
  }
  int rc = kOk;
  auto c = open_client(g, rc);
  if (!c) return rc;
  auto r = c->embed(req);
  if (!r.ok()) return bus_error(g, r.error(), c->last_error());
  const auto& info = r->info;
  if (g.json) {
    json v = json::array();
    for (const auto& x : r->vectors) v.push_back(x);
    json res = {{"model", info.model.value_or("")},       {"route", info.route.value_or("")},
                {"dim", info.dim.value_or(0)},             {"job_id", info.job_id.value_or(0)},
                {"degraded", info.degraded.value_or(false)}, {"existing", info.existing.value_or(false)},
                {"truncated", info.truncated.value_or(0)}, {"attempts", info.attempts.value_or(0)},
                {"queued_ms", info.queued_ms.value_or(0)}, {"run_ms", info.run_ms.value_or(0)},
                {"fingerprint", info.fingerprint.value_or("")}};
    out_json({{"vectors", v}, {"result", res}});
    return kOk;
  }
  std::string out;
  char buf[32];
  for (const auto& x : r->vectors) {
    for (std::size_t i = 0; i < x.size(); ++i) {
      std::snprintf(buf, sizeof buf, i ? " %.7g" : "%.7g", static_cast<double>(x[i]));
      out += buf;
    }
    out += "\n";
  }
  out_text(out);
  err_line(std::to_string(r->vectors.size()) + " vector(s) of dim " + std::to_string(info.dim.value_or(0)) + " from " +
           info.model.value_or("?") + " on " + info.route.value_or("?") + (info.degraded.value_or(false) ? " (degraded)" : "") +
           ", job " + std::to_string(info.job_id.value_or(0)) + ", " + std::to_string(info.run_ms.value_or(0)) + " ms" +
           (info.existing.value_or(false) ? " (an earlier run's vectors: same idempotency key)" : "") +
           (info.truncated.value_or(0) ? ", " + std::to_string(*info.truncated) + " text(s) truncated" : ""));
  return kOk;
}

}  // namespace tandemctl
