// Package services is idemgate's domain logic. It knows nothing of HTTP: web/ maps its typed
// errors (errors.go) to status codes in one place. It knows nothing of Prometheus either: it
// reports its decisions to an Observer (observer.go), which web/ implements with counters. It
// logs with the caller's context (slog's *Context methods), so a line written during a request
// carries its id.
//
// The services, by audience, each safe for concurrent use by any number of goroutines and
// server processes sharing one database:
//
//   - Admission (admission.go, outcome.go, release.go): the callers' hot path, acquire, the
//     owner's outcome and the owner-checked release.
//   - Reads (reads.go, queue.go): a tenant's API reads of keys, operations and attempts.
//   - Reconciliation (reconciliation.go): operators' confirmed outcomes and releases.
//   - Dashboard (dashboard.go, overview.go, queue.go): the dashboard's pages, across tenants
//     for a global account.
//   - Audit (audit.go): duplicate attempts and possible duplicate effects, and the CSV export.
//   - Reaper (reaper.go): expiry of holds and retention.
//   - Auth (auth.go): authentication, API keys on every API request (cached) and operators
//     at sign-in and on every dashboard request; SessionStore (session_store.go): dashboard
//     sessions.
//   - Accounts (accounts.go, operators.go): administration of API keys, tenants and operator
//     accounts, by a global admin or the installation itself, and the first start's Bootstrap.
//
// The vocabulary (states, attempt results, roles, event kinds) is in vocabulary.go; the rules
// of the state machine (admission, expiry to uncertain, outcome moves, release, possible
// duplicate effect) in rules.go, and who may do what in permissions.go. Everything that
// differs between PostgreSQL and SQLite sits behind the store seam (store.go, with
// store_postgres.go and store_sqlite.go); nothing else asks which database it runs on.
//
// Every rule here comes from docs/reference.md; comments cite its sections.
package services
