// Expected failures as values: Result<T> holds either a T or an Error (code + message).
// Exceptions from LibTorch / sdbus-c++ are caught at their module's edge and turned into these.
#pragma once

#include <cassert>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace tandem {

// One code space for the whole daemon; the D-Bus layer maps each to io.tandem.Tandem1.Error.<Name>.
enum class Errc {
  invalid_argument,    // caller gave a value outside its documented range
  parse_error,         // text that does not parse (JSON, TOML, protobuf)
  format_error,        // a file whose structure is wrong (bad header, overlapping ranges, ...)
  unsupported,         // well-formed but not something we implement (dtype, architecture)
  not_found,           // file, tensor, job, model that does not exist
  io_error,            // open/read/mmap failed
  out_of_memory,       // device or host allocation refused
  kv_exhausted,        // the paged KV pool has no free block
  device_lost,         // the accelerator was reset / is gone; its buffers are invalid
  cancelled,           // the job was cancelled
  queue_full,          // a bounded queue is at capacity
  host_memory,         // the host-memory guard refused
  incompatible,        // fingerprint mismatch between replicas
  illegal_transition,  // state machine refused a transition
  duplicate,           // idempotency key / id already used
  rejected,            // admission rejected (resumable, with retry hint)
  timeout,             // deadline passed
  permission_denied,   // the caller may not do this (D-Bus: NotAuthorized)
  unavailable,         // the service cannot take work now (draining, no route at all)
  resumable,           // the job ended failed-resumable: resume from its checkpoint
  internal,            // a bug: an invariant did not hold
};

std::string_view errc_name(Errc code) noexcept;

struct Error {
  Errc code = Errc::internal;
  std::string message;

  friend bool operator==(const Error&, const Error&) = default;
};

inline Error make_error(Errc code, std::string message) { return Error{code, std::move(message)}; }

// Tag type so `return fail(Errc::x, "...")` converts to any Result<T>.
struct Failure {
  Error error;
};
inline Failure fail(Errc code, std::string message) { return Failure{Error{code, std::move(message)}}; }
inline Failure fail(Error e) { return Failure{std::move(e)}; }

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::in_place_index<0>, std::move(value)) {}  // NOLINT(implicit)
  Result(Failure f) : v_(std::in_place_index<1>, std::move(f.error)) {}  // NOLINT(implicit)

  bool ok() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return ok(); }

  T& value() & { assert(ok()); return std::get<0>(v_); }
  const T& value() const& { assert(ok()); return std::get<0>(v_); }
  T&& value() && { assert(ok()); return std::get<0>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

  const Error& error() const& { assert(!ok()); return std::get<1>(v_); }
  Error&& error() && { assert(!ok()); return std::get<1>(std::move(v_)); }

 private:
  std::variant<T, Error> v_;
};

template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Failure f) : err_(std::move(f.error)), ok_(false) {}  // NOLINT(implicit)

  bool ok() const noexcept { return ok_; }
  explicit operator bool() const noexcept { return ok_; }
  const Error& error() const& { assert(!ok_); return err_; }
  Error&& error() && { assert(!ok_); return std::move(err_); }

 private:
  Error err_;
  bool ok_ = true;
};

using Status = Result<void>;

// Propagate an error from an expression returning Result<...>.
#define TANDEM_TRY(expr)                                   \
  do {                                                     \
    auto _tandem_r = (expr);                               \
    if (!_tandem_r.ok()) return ::tandem::fail(std::move(_tandem_r).error()); \
  } while (0)

}  // namespace tandem
