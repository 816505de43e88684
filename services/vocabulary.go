package services

// The vocabulary of operations, attempts and accounts. The values are stored in the database
// and appear in the API, so they never change spelling.

// Operation states (docs/reference.md §3).
const (
	StateInProgress = "in_progress"
	StateSucceeded  = "succeeded"
	StateFailed     = "failed"
	StateUncertain  = "uncertain"
	StateReleased   = "released"
)

// Attempt results (docs/reference.md §2 "attempt").
const (
	ResultAdmitted  = "admitted"
	ResultDuplicate = "duplicate"
	ResultConflict  = "conflict"
)

// Operator roles (docs/reference.md §5).
const (
	RoleAdmin    = "admin"
	RoleOperator = "operator"
	RoleAuditor  = "auditor"
)

// Event kinds, actors and reasons written to the event log.
const (
	EventStateChanged = "state_changed"
	EventOutcome      = "outcome_recorded"
	EventReleased     = "released"
	ActorSystem       = "system"
	ReasonTTLExpired  = "ttl_expired_without_outcome"
	// ReasonLeaseExpired is the reason of an operation made uncertain because its lease ran
	// out before its TTL without an outcome (docs/reference.md §8).
	ReasonLeaseExpired = "lease_expired_without_outcome"
	// ReasonReportedUncertain is the reconciliation queue's reason for an operation its caller
	// reported uncertain itself (outcome status uncertain). It is never stored: such an
	// operation's state_reason stays null, as for every state a caller or operator chose
	// (docs/reference.md §4), so the queue's reason filter (OperationFilter.Reason,
	// BulkFilter.Reason) reads this value as "state_reason IS NULL".
	ReasonReportedUncertain = "reported_uncertain"
)

// Expiry policies: what a key does once its TTL is over while its newest operation has no
// reconciled outcome (docs/reference.md §8 "on_expiry").
const (
	// OnExpiryReadmit: after the TTL a new attempt is admitted and told previous_operation.
	OnExpiryReadmit = "readmit"
	// OnExpiryHold: a key whose operation is uncertain (or succeeded) is never admitted again
	// until an operator reconciles it to failed; uncertain answers 409 outcome_uncertain.
	OnExpiryHold = "hold_until_reconciled"
)
