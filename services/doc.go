// Package services is idemgate's domain logic: admission (acquire), owner-checked release,
// outcomes, reads of keys, operations and attempts, the reaper, and authentication of API keys
// and operators. It knows nothing of HTTP; web/ maps its typed errors (errors.go) to status
// codes in one place. It knows nothing of Prometheus either: it reports its decisions to an
// Observer (observer.go), which web/ implements with counters. It logs with the caller's
// context (slog's *Context methods), so a line written during a request carries its id.
//
// Every rule here comes from ../shared/SPEC.md; comments cite its sections.
package services
