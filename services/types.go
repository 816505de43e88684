package services

import (
	"encoding/json"
	"time"
)

// Principal is the authenticated caller of the JSON API: the tenant its API key belongs to
// (id and name), the key's id (stored on the operations it creates: only that key's
// attempt_id retries are honoured) and its display prefix (recorded as the caller of
// attempts). TenantName labels metrics only; authorisation is always by TenantID.
type Principal struct {
	TenantID   int64
	TenantName string
	APIKeyID   int64
	Prefix     string
}

// Outcome is the confirmed (or explicitly uncertain) result of an operation (docs/reference.md §4).
// Response is the stored JSON response, replayed to duplicates; nil when none was recorded.
type Outcome struct {
	Status     string
	Receipt    *string
	Response   json.RawMessage
	Note       *string
	RecordedBy string
	RecordedAt time.Time
}

// Operation is the operation object of docs/reference.md §4. Held says whether the operation still holds
// its key (a live, unexpired hold). Outcome is nil until one is recorded. StateReason explains
// a state the system chose, e.g. "ttl_expired_without_outcome".
type Operation struct {
	ID                string
	Key               string
	Operation         *string
	State             string
	StateReason       *string
	FencingToken      int64
	CorrelationID     *string
	Fingerprint       *string
	Metadata          json.RawMessage
	AcquiredAt        time.Time
	ExpiresAt         time.Time
	Held              bool
	Outcome           *Outcome
	ReleasedAt        *time.Time
	ReleaseReason     *string
	DuplicateAttempts int64
	ConflictAttempts  int64
	// LeaseExpiresAt is when the attempt's lease ends (docs/reference.md §8), at most
	// ExpiresAt; OnExpiry is the key's policy after the TTL (OnExpiryReadmit or OnExpiryHold).
	LeaseExpiresAt time.Time
	OnExpiry       string
	// Lifecycle (docs/reference.md §2 "Lifecycle"). RetentionSeconds and HorizonSeconds are what
	// the operation was admitted under: nil retention, admitted before lifecycles (kept for
	// IDEMGATE_RETENTION); nil horizon, none. EvidenceUntil is when its evidence will be purged
	// (set once it ended); ProtectedUntil is when its key stops refusing new admissions because
	// of its horizon (a succeeded operation with one). EvidencePurged: this is a tombstone,
	// the evidence is gone, and only ID, Key, State, FencingToken, AcquiredAt, the outcome's
	// status and receipt, and ProtectedUntil (also in ExpiresAt and LeaseExpiresAt) are known.
	RetentionSeconds *int64
	HorizonSeconds   *int64
	EvidenceUntil    *time.Time
	ProtectedUntil   *time.Time
	EvidencePurged   bool
}

// PreviousOperation summarises the newest earlier generation of a key that may have had its
// effect (uncertain, or succeeded and now admitted again; released and failed generations are
// skipped: warnedGeneration), so the new attempt can check the destination first
// (docs/reference.md §4).
type PreviousOperation struct {
	ID             string
	State          string
	FencingToken   int64
	OutcomeStatus  *string
	OutcomeReceipt *string
}

// Acquisition is the answer to an acquire that was not refused. When Admitted, OperationID,
// OwnerToken (the only copy of the secret), FencingToken and ExpiresAt describe the new hold;
// when not, Operation is the holder's current operation (a duplicate).
type Acquisition struct {
	Admitted       bool
	Readmitted     bool // an attempt_id retry got its own operation back
	Key            string
	OperationID    string
	OwnerToken     string
	FencingToken   int64
	State          string
	ExpiresAt      time.Time
	LeaseExpiresAt time.Time
	OnExpiry       string
	// RetentionSeconds and HorizonSeconds: the admitted operation's (Operation's fields).
	RetentionSeconds *int64
	HorizonSeconds   *int64
	// TTLSeconds and LeaseSeconds are the hold and lease the admitted operation was granted,
	// in whole seconds from its admission (rounded down): the request's, or its policy's where
	// it left them out (docs/reference.md §2), so a client can time its lease without having
	// sent one.
	TTLSeconds        int64
	LeaseSeconds      int64
	PreviousOperation *PreviousOperation
	Operation         *Operation
}

// KeyView is a key and its newest operation (docs/reference.md §4 "GET /v1/keys/{key}"). ExpiresAt is
// nil when the key is not held. Operation is nil only if retention purged it.
type KeyView struct {
	Key        string
	Held       bool
	ExpiresAt  *time.Time
	AcquiredAt time.Time
	Operation  *Operation
}

// Attempt is one logged acquire call (docs/reference.md §2).
type Attempt struct {
	ID            int64
	Key           string
	OperationID   *string
	Result        string
	AttemptID     *string
	Operation     *string
	Fingerprint   *string
	CorrelationID *string
	Caller        string
	AttemptedAt   time.Time
}

// Event is one entry of an operation's event log.
type Event struct {
	Kind      string
	Actor     string
	Detail    string
	CreatedAt time.Time
}

// OperationDetail is an operation with its attempts (oldest first) and events (oldest first).
type OperationDetail struct {
	Operation
	Attempts []Attempt
	Events   []Event
}
