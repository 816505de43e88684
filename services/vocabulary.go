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
)
