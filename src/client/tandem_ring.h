/* A small C API over tandemd's ring sessions (docs/rings.md): open a session over D-Bus, submit prompts, read job
 * events. For C programs and language bindings; C++ code can use tandem::client::RingSession directly.
 *
 * Threading: a session is used by one thread at a time. Strings returned in an event stay valid until the next
 * tandem_session_wait()/tandem_session_close() on that session. All functions return 0 or a negative TANDEM_E_*
 * code; tandem_session_error() describes the last failure. */
#ifndef TANDEM_RING_H
#define TANDEM_RING_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tandem_session tandem_session;

enum {
  TANDEM_OK = 0,
  TANDEM_E_INVALID = -1,     /* bad argument */
  TANDEM_E_BUS = -2,         /* cannot reach tandemd / the bus */
  TANDEM_E_REFUSED = -3,     /* tandemd refused (not authorized, session limit, rings disabled) */
  TANDEM_E_AGAIN = -4,       /* the ring is full right now: read events, then retry */
  TANDEM_E_CLOSED = -5,      /* the session ended (see tandem_session_error) */
  TANDEM_E_TIMEOUT = -6,     /* tandem_session_wait: nothing arrived in time */
  TANDEM_E_INTERNAL = -7
};

/* Opens a session. bus: NULL = $TANDEM_BUS or the system bus; else "system", "session" or "address=unix:path=...".
 * On failure *out is NULL and, when err is not NULL, a message is written there (NUL-terminated, truncated). */
int tandem_session_open(const char* bus, tandem_session** out, char* err, size_t err_size);
/* CloseSession, unmap, disconnect. NULL is fine. */
void tandem_session_close(tandem_session* s);
uint64_t tandem_session_id(const tandem_session* s);
const char* tandem_session_error(const tandem_session* s);

typedef struct {
  const char* model;            /* NULL or "" = the default model */
  const char* prompt;           /* UTF-8 */
  int32_t max_tokens;           /* <= 0: the model's default */
  double temperature;           /* < 0: the model's default; 0 = greedy */
  int64_t seed;                 /* < 0: none */
  const char* idempotency_key;  /* NULL = none */
  int side_effects;             /* 0/1 */
  int allow_cpu;                /* < 0: default (yes); 0 = GPU only; 1 = yes */
} tandem_request;

void tandem_request_init(tandem_request* r); /* all defaults */

int tandem_session_submit(tandem_session* s, const tandem_request* r, uint64_t user_data);
int tandem_session_cancel(tandem_session* s, uint64_t job_id, uint64_t user_data);

typedef enum {
  TANDEM_EVENT_ACCEPTED = 1,
  TANDEM_EVENT_ROUTED = 2,
  TANDEM_EVENT_STARTED = 3,
  TANDEM_EVENT_TOKENS = 4,
  TANDEM_EVENT_MIGRATED = 5,
  TANDEM_EVENT_FINISHED = 6,
  TANDEM_EVENT_ERROR = 7,
  TANDEM_EVENT_CANCEL_RESULT = 8,
  TANDEM_EVENT_NOP = 9
} tandem_event_kind;

typedef struct {
  tandem_event_kind kind;
  uint64_t user_data;
  uint64_t job_id;
  /* tokens */
  const char* text;          /* NUL-terminated; text_length bytes */
  size_t text_length;
  const int32_t* tokens;
  size_t token_count;
  uint32_t step;
  int gap;                   /* earlier tokens were dropped (overflow): GetJob has them */
  /* accepted / routed / started / migrated */
  const char* route;         /* gpu | hybrid | cpu ("" if not given) */
  int degraded;
  uint64_t eta_ms;
  /* finished / cancel_result */
  const char* state;         /* completed | failed | cancelled | ... */
  const char* finish_reason;
  uint32_t tokens_total;
  /* error (and failed jobs) */
  const char* error_name;    /* "Busy", "QueueFull", ... */
  const char* error_message;
  uint64_t retry_after_ms;   /* 0 = none */
} tandem_event;

/* Waits up to timeout_ms (-1 = forever) for the next event. TANDEM_E_TIMEOUT when none came,
 * TANDEM_E_CLOSED when the session ended and no event is left. */
int tandem_session_wait(tandem_session* s, tandem_event* ev, int timeout_ms);

#ifdef __cplusplus
}
#endif

#endif /* TANDEM_RING_H */
