/* it_ring.sh's client of the C API (src/client/tandem_ring.h), compiled as C: opens a session ($TANDEM_BUS), submits
 * one prompt, writes the streamed text to stdout and, on stderr, "job=<id> state=<state> finish_reason=<r>
 * tokens_total=<n> streamed=<n>". Exit 0 only when the job finished completed with every token streamed in order;
 * 1 otherwise; 2 on usage errors.
 *   c_api_client PROMPT MAX_TOKENS SEED */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/tandem_ring.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: c_api_client PROMPT MAX_TOKENS SEED\n");
    return 2;
  }
  char err[512] = "";
  tandem_session* s = NULL;
  int rc = tandem_session_open(NULL, &s, err, sizeof err);
  if (rc != TANDEM_OK || s == NULL) {
    fprintf(stderr, "c_api_client: tandem_session_open: %d: %s\n", rc, err);
    return 1;
  }
  tandem_request req;
  tandem_request_init(&req);
  req.prompt = argv[1];
  req.max_tokens = atoi(argv[2]);
  req.seed = atoll(argv[3]);
  const uint64_t ud = 0x5eed;
  rc = tandem_session_submit(s, &req, ud);
  if (rc != TANDEM_OK) {
    fprintf(stderr, "c_api_client: submit: %d: %s\n", rc, tandem_session_error(s));
    tandem_session_close(s);
    return 1;
  }
  uint64_t job = 0;
  uint32_t next_step = 0, streamed = 0;
  int ok = 1, done = 0, accepted = 0;
  char state[64] = "", finish_reason[64] = "";
  uint32_t tokens_total = 0;
  while (!done) {
    tandem_event ev;
    rc = tandem_session_wait(s, &ev, 60000);
    if (rc != TANDEM_OK) {
      fprintf(stderr, "c_api_client: wait: %d: %s\n", rc, tandem_session_error(s));
      ok = 0;
      break;
    }
    if (ev.user_data != ud) {
      fprintf(stderr, "c_api_client: event %d with user_data %llu, want %llu\n", (int)ev.kind,
              (unsigned long long)ev.user_data, (unsigned long long)ud);
      ok = 0;
    }
    switch (ev.kind) {
      case TANDEM_EVENT_ACCEPTED:
        job = ev.job_id;
        accepted = 1;
        break;
      case TANDEM_EVENT_TOKENS:
        if (!accepted || ev.job_id != job) {
          fprintf(stderr, "c_api_client: tokens before accepted or of another job\n");
          ok = 0;
        }
        if (ev.step != next_step || ev.gap) {
          fprintf(stderr, "c_api_client: token step %u (gap %d), want %u\n", ev.step, ev.gap, next_step);
          ok = 0;
        }
        if (ev.text == NULL || strlen(ev.text) != ev.text_length) {
          fprintf(stderr, "c_api_client: text of %zu bytes is not NUL-terminated there\n", ev.text_length);
          ok = 0;
        } else {
          fwrite(ev.text, 1, ev.text_length, stdout);
        }
        next_step = ev.step + (uint32_t)ev.token_count;
        streamed += (uint32_t)ev.token_count;
        break;
      case TANDEM_EVENT_FINISHED:
        snprintf(state, sizeof state, "%s", ev.state ? ev.state : "");
        snprintf(finish_reason, sizeof finish_reason, "%s", ev.finish_reason ? ev.finish_reason : "");
        tokens_total = ev.tokens_total;
        done = 1;
        break;
      case TANDEM_EVENT_ERROR:
        fprintf(stderr, "c_api_client: error %s: %s\n", ev.error_name ? ev.error_name : "?",
                ev.error_message ? ev.error_message : "");
        ok = 0;
        done = 1;
        break;
      case TANDEM_EVENT_ROUTED:
      case TANDEM_EVENT_STARTED:
      case TANDEM_EVENT_MIGRATED:
        break;
      default:
        fprintf(stderr, "c_api_client: unexpected event kind %d\n", (int)ev.kind);
        ok = 0;
    }
  }
  fflush(stdout);
  fprintf(stderr, "job=%llu state=%s finish_reason=%s tokens_total=%u streamed=%u\n", (unsigned long long)job, state,
          finish_reason, tokens_total, streamed);
  tandem_session_close(s);
  if (strcmp(state, "completed") != 0) ok = 0;
  if (tokens_total != streamed) {
    fprintf(stderr, "c_api_client: finished says %u tokens, %u were streamed\n", tokens_total, streamed);
    ok = 0;
  }
  return ok ? 0 : 1;
}
