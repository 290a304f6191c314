// Umbrella header of tandem_policy: pure admission, failover and degraded-mode decisions (no clock, no I/O,
// no threads, no LibTorch, no D-Bus). See docs/policy.md.
#pragma once

#include "policy/admission.h"
#include "policy/breaker.h"
#include "policy/config.h"
#include "policy/estimator.h"
#include "policy/format.h"
#include "policy/headroom.h"
#include "policy/host_guard.h"
#include "policy/idempotency.h"
#include "policy/job.h"
#include "policy/ledger.h"
#include "policy/procfs.h"
#include "policy/queue.h"
#include "policy/replica_mode.h"
#include "policy/service_state.h"
#include "policy/types.h"
#include "policy/unit_times.h"
