// Package history holds the history checker of issue 4 point 1: Jepsen-style concurrent
// workloads against real idemgate processes, checked for linearizability with
// github.com/anishathalye/porcupine against a model of docs/reference.md §3–4.
//
// The package has tests only. The same workload and model also run against an in-memory fake
// of the API (fake_test.go): correct, where the history must check, and with a
// check-then-insert acquire, a release without the owner compare, a renew without the owner
// check, or a hold_until_reconciled that re-admits after the TTL, where porcupine must report
// a violation. The workload (workload_test.go) sends lease_seconds, acquires its last key with
// on_expiry hold_until_reconciled, renews, and lets one admission in four (and every one of
// the hold key) "crash": its client goes quiet for 2–3 s (the lease lapses) and then
// reconciles it. Run it with
//
//	go test ./e2e/history/ -count=1 -v
//	VERIFY_DURATION=5m go test ./e2e/history/ -count=1 -v -timeout 30m
//
// It sits under e2e/ because it tests end to end (built binary, real PostgreSQL), but unlike
// the browser tests in e2e/ itself it needs no Chromium and no e2e build tag: `make test`
// runs it with the race detector together with every other package, and `make e2e` runs only
// ./e2e/, not this package.
//
// What the model (model_test.go) checks, per key, in every linearization of the history:
//
//   - acquire 201: its fencing token is exactly the previous admission's plus one, its
//     operation id is new, and the key was free at some point of the call: never held,
//     released, or the holder's expires_at (as answered by the server, database clock) minus
//     a one-second clock allowance is not after the call's return. A takeover turns an
//     in_progress holder into uncertain.
//   - acquire 200: names the current holder, whose hold was live at some point of the call
//     (call start before expires_at plus the allowance), with the same fingerprint and
//     operation name, and reports its current state. (This check found a real bug: the
//     PostgreSQL idemgate_acquire read the hold and the holder's operation in different
//     snapshots, so a duplicate could report an operation "released" by a release that
//     committed in between. The function now locks the operation row and re-checks. When the
//     check fails, the test also says whether the history passes with such torn duplicate
//     answers tolerated, see modelOptions.tornDuplicate, to tell this class from others.)
//   - acquire 422: the key is held (live) by another fingerprint or operation name.
//   - release 200: only by the current, live holder, only from in_progress or failed; the
//     operation becomes released and the key free. not_owner / effect_confirmed /
//     outcome_uncertain / key_not_held are each allowed only in the situation they name and
//     change nothing; a release with a wrong owner token never succeeds.
//   - outcome 200: the state the server reports is a transition docs/reference.md §3 permits from the
//     operation's state (or the same outcome again); 403 only for a wrong owner token;
//     409 invalid_transition never where the transition is always permitted.
//   - leases (docs/reference.md §8): an in_progress operation may turn uncertain from its
//     lease_expires_at minus the allowance on; a duplicate after its lease (plus the allowance)
//     never reports it in_progress; a 409 outcome_uncertain names the current holder, uncertain
//     (or lapsed), whose hold still protects the key. With hold_until_reconciled a duplicate
//     never gets a 200 reporting uncertain, and the key is never admitted again while its
//     operation is in_progress or uncertain, TTL or not.
//   - renew 200: only with the owner's token, only for the in_progress current holder whose
//     lease and hold were live at the call; the lease end and expires_at become the answered
//     ones (the lease capped at expires_at without extend_ttl). 403 only for a wrong token;
//     lease_expired only for a lapsed lease, an uncertain or superseded operation;
//     invalid_transition only when it is not in_progress or not the holder.
//   - GET /v1/keys/{key}: 404 only if never admitted; held=true only for the live current
//     holder; the operation named is the newest admission with its fencing token.
//   - lifecycle (docs/reference.md §2): the two-process run sets a policy that gives "charge"
//     a retention of 1 s and a horizon of 2 s, and its servers reap every second. A success of
//     "charge" keeps its key from a new admission until 2 s after its outcome call (the end
//     lies within the call), answered 200 by the operation or, once purged, by its tombstone
//     (the recorder counts those), and 422 for another request; after that the key may be
//     admitted with the next fencing token. A purged operation's outcome or renew may be 404,
//     and GET /v1/keys may then name no operation. The fake gives "charge" the same horizon,
//     and a fake that re-admits a success after its TTL within the horizon must be caught.
//
// What it abstracts:
//
//   - Time: expiry is nondeterministic inside [expires_at-1s, expires_at+1s] relative to the
//     caller's clock (server and database run on one machine). The reaper's in_progress ->
//     uncertain step is allowed at any point after expires_at-1s.
//   - Calls with no answer (transport error, timeout, 5xx) have an unknown outcome: they are
//     given a return time after the whole history and the model lets them either have taken
//     effect (an unseen admission gets an unknown id and an expiry that may pass at any time)
//     or not. Unanswered reads are dropped. Against the real server the database settles
//     acquires: each sends its own attempt_id, which the operation it admits records, so after
//     the run an unanswered acquire either becomes a lost admission (id and fencing token
//     known, expiry not) or, having admitted nothing, is dropped (resolveLostAcquires). Open,
//     a few dozen of them on one key put the search past its time bound.
//   - Receipts, responses, metadata, correlation ids, attempt_id retries, duplicate counters and
//     the operation state inside GET /v1/keys answers (read non-atomically by the server)
//     are not modelled; an outcome's receipt is a function of its status, so "the same
//     outcome again" means the same status.
//
// After the run the database itself is checked (history_test.go): every 201 is exactly one
// operations row, fencing tokens per key are exactly 1..n, at most one hold per key and it
// names the newest operation, and every answered acquire is in the attempt log; with purges,
// an admitted operation may be gone (with its attempts), and tokens are distinct and within
// the key's.
//
// tombstone_crash_test.go kills reapers with SIGKILL while they turn expired successes into
// tombstones (TOMBSTONE_N keys, default 3,000; the report used 100,000), with callers
// retrying every key: no re-admission within a horizon, and no duplicate answered with another
// or a missing response.
//
// Faults (faults_test.go): the same workload and checks run with one server process killed
// (SIGKILL) and restarted twice, with the test database's PostgreSQL backends terminated every
// 300 ms, and with both servers cut off from PostgreSQL for 2.5 s through TCP proxies (the real
// server is shared with other test packages and never stopped). Answers during faults may be
// 503 store_unavailable or lost (unknown outcome), never wrong.
package history
