package client

import (
	"encoding/json"
	"strings"
	"time"
)

// Operation states (docs/reference.md §3).
const (
	StateInProgress = "in_progress" // admitted; no outcome yet
	StateSucceeded  = "succeeded"   // effect confirmed; terminal
	StateFailed     = "failed"      // confirmed: no effect, or rollback confirmed
	StateUncertain  = "uncertain"   // outcome unknown; needs reconciliation
	StateReleased   = "released"    // the owner released the key; no effect; terminal
)

// Outcome statuses a caller may record (OutcomeRequest.Status; docs/reference.md §4).
const (
	StatusSucceeded = "succeeded"
	StatusFailed    = "failed"
	StatusUncertain = "uncertain"
)

// Expiry policies of an operation (AcquireRequest.OnExpiry; docs/reference.md §8).
const (
	// OnExpiryReadmit (the server's default): after the TTL a new attempt is admitted and
	// told PreviousOperation.
	OnExpiryReadmit = "readmit"
	// OnExpiryHoldUntilReconciled: a key whose operation is uncertain is never admitted
	// again, whatever the TTL, until the operation is reconciled to succeeded or failed;
	// acquires meanwhile are refused with ErrOutcomeUncertain carrying the operation.
	OnExpiryHoldUntilReconciled = "hold_until_reconciled"
)

// MaxWait is the longest wait WaitOperation asks the server for (docs/reference.md §8).
const MaxWait = 60 * time.Second

// Attempt results (docs/reference.md §2).
const (
	ResultAdmitted  = "admitted"
	ResultDuplicate = "duplicate"
	ResultConflict  = "conflict"
)

// Limits of docs/reference.md §2 and §4 that callers may want to check before sending. Lengths are in
// bytes for keys and serialized JSON, in characters (Unicode code points) for the other text.
const (
	MaxKeyBytes           = 255       // key: 1–255 bytes of UTF-8, no control characters, not all white space
	MaxOperationNameChars = 64        // operation: 1–64 of [A-Za-z0-9._:-]
	MaxFingerprintChars   = 256       // fingerprint
	MaxCorrelationIDChars = 128       // correlation_id
	MaxAttemptIDChars     = 128       // attempt_id
	MaxMetadataBytes      = 16 << 10  // metadata, serialized
	MaxReasonChars        = 500       // release reason
	MaxReceiptChars       = 512       // outcome receipt
	MaxNoteChars          = 1000      // outcome note
	MaxResponseBytes      = 64 << 10  // outcome response, serialized
	MaxBodyBytes          = 256 << 10 // any request body but AcquireBatch's (and each of its items)
	MaxBatchBodyBytes     = 2 << 20   // AcquireBatch's request body
	MaxBatchItems         = 500       // requests in one AcquireBatch
	MaxListLimit          = 500       // limit of ListKeys, ListOperations and ListAttempts
)

// AcquireRequest asks to admit one attempt of an operation (docs/reference.md §4 "POST /v1/acquire").
// Empty strings and a nil Metadata are absent fields.
type AcquireRequest struct {
	// Key is the idempotency key, unique per tenant: 1–255 bytes of UTF-8, no control
	// characters, not all white space; compared byte-exact. Required.
	Key string
	// TTL is how long the hold lasts: whole seconds from 1 s to the server's maximum
	// (30 days by default). It is sent as ttl_seconds, and a TTL that is not a whole number of
	// seconds is refused before sending. Zero leaves it out: the TTL of the tenant's policy for
	// the operation applies (docs/reference.md §2), and without one the server refuses the
	// acquire (ErrInvalidRequest, field ttl_seconds).
	TTL time.Duration
	// Operation is the business operation name, 1–64 characters of [A-Za-z0-9._:-].
	Operation string
	// Fingerprint identifies the request's parameters (e.g. "sha256:…"), at most 256
	// characters. A later acquire of the held key with another fingerprint is refused with
	// ErrFingerprintMismatch.
	Fingerprint string
	// CorrelationID is free text to find the attempt again (a request or trace id), ≤ 128
	// characters.
	CorrelationID string
	// AttemptID identifies this acquire call across its retries (≤ 128 characters). Leave it
	// empty and the client generates a random UUID; either way the same id is sent on every
	// retry of the call, so a retry after a lost 201 answers 201 again for the same operation
	// (docs/reference.md §4 attempt_id) instead of a duplicate. Set it yourself to retry across calls or
	// processes. The server honours it only from the API key that acquired and only while the
	// operation is in_progress; otherwise the retry is an ordinary duplicate (Duplicate set).
	AttemptID string
	// Metadata is any value that marshals to a JSON object of at most 16 KiB, stored with the
	// operation for operators. nil is absent.
	Metadata any
	// Lease is how long the admitted attempt may run without an outcome (or a Renew) before
	// it is presumed crashed and its operation becomes uncertain (docs/reference.md §8). Whole
	// seconds from 1 s to TTL; sent as lease_seconds. 0 is absent: the lease is the TTL.
	Lease time.Duration
	// OnExpiry is OnExpiryReadmit or OnExpiryHoldUntilReconciled; "" is absent (readmit).
	OnExpiry string
}

// AcquireResult is the answer to an acquire that was not refused. Exactly one of Admitted
// and Duplicate is set; the third outcome, a held key with another fingerprint or operation
// name, is the error ErrFingerprintMismatch (422).
type AcquireResult struct {
	// Key is the key acquired.
	Key string
	// AttemptID is the attempt_id that was sent (the caller's, or the generated one).
	AttemptID string
	// Admitted is set when this attempt may run the operation (201).
	Admitted *Admission
	// Duplicate is set when an earlier attempt holds the key (200): the holder's operation
	// with its state, outcome, receipt and stored response, so the caller can return or
	// reconcile it instead of running again.
	Duplicate *Operation
}

// BatchResult is one request's answer in Client.AcquireBatch: exactly one of Result (what
// Acquire would have returned: Admitted or Duplicate set) and Err (the error Acquire would
// have returned for it alone, e.g. ErrFingerprintMismatch or ErrInvalidRequest).
type BatchResult struct {
	Result *AcquireResult
	Err    error
}

// Admission is a granted hold (the 201 answer of acquire).
type Admission struct {
	// OperationID identifies the new operation; RecordOutcome and GetOperation take it.
	OperationID string `json:"operation_id"`
	// OwnerToken is the secret that proves ownership for Release and RecordOutcome. The
	// server keeps only its hash: this is the only copy.
	OwnerToken string `json:"owner_token"`
	// FencingToken is 1 for the key's first admission and one more for each later one; pass
	// it to the destination so it can reject a stale attempt.
	FencingToken int64 `json:"fencing_token"`
	// State is "in_progress".
	State string `json:"state"`
	// ExpiresAt is when the hold ends (database clock, UTC).
	ExpiresAt time.Time `json:"expires_at"`
	// LeaseExpiresAt is when the lease lapses unless renewed (database clock, UTC;
	// docs/reference.md §8). It is never after ExpiresAt.
	LeaseExpiresAt time.Time `json:"lease_expires_at"`
	// OnExpiry is the operation's expiry policy, OnExpiryReadmit or
	// OnExpiryHoldUntilReconciled.
	OnExpiry string `json:"on_expiry"`
	// TTLSeconds and LeaseSeconds are the hold and lease granted, in whole seconds: the
	// request's, or the policy's where it left them out (docs/reference.md §2).
	TTLSeconds   int64 `json:"ttl_seconds"`
	LeaseSeconds int64 `json:"lease_seconds"`
	// RetentionSeconds and HorizonSeconds are the lifecycle the operation was admitted under
	// (docs/reference.md §2 "Lifecycle"): nil retention is the server's IDEMGATE_RETENTION,
	// nil horizon none.
	RetentionSeconds *int64 `json:"retention_seconds"`
	HorizonSeconds   *int64 `json:"horizon_seconds"`
	// PreviousOperation names the newest earlier generation of the key that may have had its
	// effect (uncertain, or succeeded and the key admitted again after its TTL; released and
	// failed generations are skipped), if any: check the destination before acting
	// (docs/reference.md §4).
	PreviousOperation *PreviousOperation `json:"previous_operation,omitempty"`

	// lease is the lease duration asked for (the TTL when none was), and sentAt when the
	// acquire call started: sentAt+lease is a local lease deadline that is never later than
	// the server's, whatever the clocks say.
	lease  time.Duration
	sentAt time.Time
}

// Lease returns the admission as the Lease that Heartbeat renews and Do hands to its fn.
func (a *Admission) Lease() Lease {
	return Lease{OperationID: a.OperationID, OwnerToken: a.OwnerToken, FencingToken: a.FencingToken,
		ExpiresAt: a.ExpiresAt, LeaseExpiresAt: a.LeaseExpiresAt, PreviousOperation: a.PreviousOperation,
		Duration: a.lease, deadline: a.sentAt.Add(a.lease)}
}

// PreviousOperation summarises, in an Admission, the earlier generation of the key that may
// have had its effect (docs/reference.md §4).
type PreviousOperation struct {
	ID           string      `json:"id"`
	State        string      `json:"state"`
	FencingToken int64       `json:"fencing_token"`
	Outcome      *OutcomeRef `json:"outcome,omitempty"`
}

// OutcomeRef is what a new attempt needs of a previous outcome to check the destination.
type OutcomeRef struct {
	Status  string `json:"status"`
	Receipt string `json:"receipt,omitempty"`
}

// ReleaseRequest is an owner-checked release (docs/reference.md §4 "POST /v1/release").
type ReleaseRequest struct {
	// Key is the held key. Required.
	Key string
	// OwnerToken is Admission.OwnerToken. Required.
	OwnerToken string
	// Reason is free text, ≤ 500 characters, shown to operators.
	Reason string
	// OperationID is Admission.OperationID. Optional, but set it: after a retry, the server
	// answers a release whose first try already succeeded with key_not_held or not_owner
	// (docs/reference.md §4: a release is a compare-and-delete, and the hold is gone), and with the
	// operation id the client checks the operation and reports that release as done.
	OperationID string
}

// OutcomeRequest records an operation's outcome (docs/reference.md §4
// "POST /v1/operations/{id}/outcome"). Empty strings and a nil Response are absent fields.
type OutcomeRequest struct {
	// OwnerToken is Admission.OwnerToken. Required; a wrong one is ErrNotOwner (403) whatever
	// else is wrong.
	OwnerToken string
	// Status is StatusSucceeded, StatusFailed or StatusUncertain. Required.
	Status string
	// Receipt is the destination's receipt or reference, ≤ 512 characters.
	Receipt string
	// Response is any value that marshals to at most 64 KiB of JSON, stored and handed to
	// duplicates (Operation.Outcome.Response). A json.RawMessage is sent as it is; a []byte
	// marshals as a base64 string. Over 64 KiB is ErrPayloadTooLarge and nothing changes.
	Response any
	// Note is free text, ≤ 1000 characters.
	Note string
	// Release, only with StatusFailed, also releases the hold in the same transaction (if
	// this operation still holds the key), so the key can be admitted again at once.
	Release bool
}

// Operation is idemgate's operation object (docs/reference.md §4): one admitted attempt and its
// durable evidence. Absent (JSON null) text fields are "".
type Operation struct {
	ID            string `json:"id"`
	Key           string `json:"key"`
	Operation     string `json:"operation"`
	State         string `json:"state"`
	StateReason   string `json:"state_reason"` // e.g. "ttl_expired_without_outcome"
	FencingToken  int64  `json:"fencing_token"`
	CorrelationID string `json:"correlation_id"`
	Fingerprint   string `json:"fingerprint"`
	// Metadata is the stored JSON object, nil when none was given.
	Metadata   json.RawMessage `json:"metadata"`
	AcquiredAt time.Time       `json:"acquired_at"`
	ExpiresAt  time.Time       `json:"expires_at"`
	// LeaseExpiresAt is when the attempt's lease lapses (or lapsed) unless renewed
	// (docs/reference.md §8); zero from a server without leases.
	LeaseExpiresAt time.Time `json:"lease_expires_at"`
	// OnExpiry is the operation's expiry policy (OnExpiryReadmit or
	// OnExpiryHoldUntilReconciled).
	OnExpiry string `json:"on_expiry"`
	// Held reports whether this operation still holds its key (a live, unexpired hold).
	Held bool `json:"held"`
	// Outcome is nil until one is recorded.
	Outcome           *Outcome   `json:"outcome"`
	ReleasedAt        *time.Time `json:"released_at"`
	ReleaseReason     string     `json:"release_reason"`
	DuplicateAttempts int64      `json:"duplicate_attempts"`
	ConflictAttempts  int64      `json:"conflict_attempts"`
	// Lifecycle (docs/reference.md §2 "Lifecycle"): the retention and horizon the operation
	// was admitted under (nil: the server's IDEMGATE_RETENTION; no horizon), when its
	// evidence is purged and until when its key refuses new admissions because of its horizon
	// (nil when not set). EvidencePurged marks a tombstone: the evidence was purged within the
	// horizon, and only ID, Key, State, FencingToken, AcquiredAt, the outcome's Status and
	// Receipt, and ProtectedUntil (also as ExpiresAt) are known.
	RetentionSeconds *int64     `json:"retention_seconds"`
	HorizonSeconds   *int64     `json:"horizon_seconds"`
	EvidenceUntil    *time.Time `json:"evidence_until"`
	ProtectedUntil   *time.Time `json:"protected_until"`
	EvidencePurged   bool       `json:"evidence_purged"`
}

// Outcome is a recorded outcome of an operation. Returned by Do's fn it is the outcome to
// record: only Status ("" means StatusSucceeded), Receipt, Response (valid JSON, ≤ 64 KiB) and
// Note are used.
type Outcome struct {
	Status  string `json:"status"`
	Receipt string `json:"receipt"`
	// Response is the stored response as the server returns it (compact JSON), nil when none
	// was recorded.
	Response   json.RawMessage `json:"response"`
	Note       string          `json:"note"`
	RecordedBy string          `json:"recorded_by"` // "api:<key prefix>" or an operator's name
	RecordedAt time.Time       `json:"recorded_at"`
}

// OperationDetail is an operation with its attempts and events, oldest first (at most the
// first 1000 of each).
type OperationDetail struct {
	Operation
	Attempts []Attempt `json:"attempts"`
	Events   []Event   `json:"events"`
}

// Attempt is one logged acquire call (docs/reference.md §2).
type Attempt struct {
	ID            int64     `json:"id"`
	Key           string    `json:"key"`
	OperationID   string    `json:"operation_id"` // the operation admitted, or the one holding the key
	Result        string    `json:"result"`       // ResultAdmitted, ResultDuplicate or ResultConflict
	AttemptID     string    `json:"attempt_id"`
	Operation     string    `json:"operation"`
	Fingerprint   string    `json:"fingerprint"`
	CorrelationID string    `json:"correlation_id"`
	Caller        string    `json:"caller"` // the API key's display prefix
	AttemptedAt   time.Time `json:"attempted_at"`
}

// Event is one entry of an operation's event log.
type Event struct {
	Kind      string    `json:"kind"`
	Actor     string    `json:"actor"`
	Detail    string    `json:"detail"`
	CreatedAt time.Time `json:"created_at"`
}

// KeyView is a key and its newest operation (docs/reference.md §4 "GET /v1/keys/{key}").
type KeyView struct {
	Key  string `json:"key"`
	Held bool   `json:"held"`
	// ExpiresAt is nil when the key is not held.
	ExpiresAt  *time.Time `json:"expires_at"`
	AcquiredAt time.Time  `json:"acquired_at"`
	// Operation is nil only if retention purged it.
	Operation *Operation `json:"operation"`
}

// ListKeysOptions filters ListKeys. Zero values are no filter.
type ListKeysOptions struct {
	State     string // one of the State… constants
	Operation string // operation name
	Prefix    string // key prefix
	Limit     int    // 1–500; 0 is the server's default
	Cursor    string // KeyPage.NextCursor of the previous page
}

// KeyPage is one page of ListKeys, newest first. NextCursor is "" on the last page.
type KeyPage struct {
	Items      []KeyView `json:"items"`
	NextCursor string    `json:"next_cursor"`
}

// ListOperationsOptions selects ListOperations' page. State "" means StateUncertain, the only
// state the server lists operations by.
type ListOperationsOptions struct {
	State  string // StateUncertain
	Limit  int    // 1–500; 0 is the server's default
	Cursor string // OperationPage.NextCursor of the previous page
}

// OperationPage is one page of ListOperations, oldest first by the time each operation became
// uncertain. NextCursor is "" on the last page.
type OperationPage struct {
	Items      []QueuedOperation `json:"items"`
	NextCursor string            `json:"next_cursor"`
}

// QueuedOperation is one item of the reconciliation queue: the operation, when it became
// uncertain (the queue's order, UTC), and whether a later operation of its key was admitted
// since (Superseded: GetKey and ListKeys then show that later one).
type QueuedOperation struct {
	Operation
	UncertainAt time.Time `json:"uncertain_at"`
	Superseded  bool      `json:"superseded"`
}

// ListAttemptsOptions filters ListAttempts. Zero values are no filter.
type ListAttemptsOptions struct {
	Key    string    // exact key
	Result string    // ResultAdmitted, ResultDuplicate or ResultConflict
	Since  time.Time // only attempts at or after this time
	Limit  int       // 1–500; 0 is the server's default
	Cursor string    // AttemptPage.NextCursor of the previous page
}

// AttemptPage is one page of ListAttempts, newest first. NextCursor is "" on the last page.
type AttemptPage struct {
	Items      []Attempt `json:"items"`
	NextCursor string    `json:"next_cursor"`
}

// Wire shapes of requests and of answers that differ from the public types.

type acquireBody struct {
	Key           string          `json:"key"`
	TTLSeconds    int64           `json:"ttl_seconds,omitempty"`
	Operation     string          `json:"operation,omitempty"`
	Fingerprint   string          `json:"fingerprint,omitempty"`
	CorrelationID string          `json:"correlation_id,omitempty"`
	AttemptID     string          `json:"attempt_id"`
	Metadata      json.RawMessage `json:"metadata,omitempty"`
	LeaseSeconds  int64           `json:"lease_seconds,omitempty"`
	OnExpiry      string          `json:"on_expiry,omitempty"`
}

type renewBody struct {
	OwnerToken   string `json:"owner_token"`
	LeaseSeconds int64  `json:"lease_seconds"`
	ExtendTTL    bool   `json:"extend_ttl,omitempty"`
}

// Renewal is the answer to Renew (docs/reference.md §8).
type Renewal struct {
	OperationID string `json:"operation_id"`
	// LeaseExpiresAt is the new end of the lease (database clock, UTC).
	LeaseExpiresAt time.Time `json:"lease_expires_at"`
	// ExpiresAt is the end of the protection window, moved only with extendTTL.
	ExpiresAt    time.Time `json:"expires_at"`
	FencingToken int64     `json:"fencing_token"`
}

type acquireAnswer struct {
	Admitted bool   `json:"admitted"`
	Key      string `json:"key"`
	Admission
	Operation *Operation `json:"operation"`
}

// acquireBatchBody is the body of POST /v1/acquire:batch.
type acquireBatchBody struct {
	Items []acquireBody `json:"items"`
}

// acquireBatchAnswer is its 200 answer: per item, the status a single acquire would have had
// and that answer's body or problem document, kept raw until the status says which.
type acquireBatchAnswer struct {
	Results []struct {
		Status  int             `json:"status"`
		Body    json.RawMessage `json:"body"`
		Problem json.RawMessage `json:"problem"`
	} `json:"results"`
}

type releaseBody struct {
	Key        string `json:"key"`
	OwnerToken string `json:"owner_token"`
	Reason     string `json:"reason,omitempty"`
}

type releaseAnswer struct {
	Released  bool      `json:"released"`
	Operation Operation `json:"operation"`
}

type outcomeBody struct {
	OwnerToken string          `json:"owner_token"`
	Status     string          `json:"status"`
	Receipt    string          `json:"receipt,omitempty"`
	Response   json.RawMessage `json:"response,omitempty"`
	Note       string          `json:"note,omitempty"`
	Release    bool            `json:"release,omitempty"`
}

// normalize turns JSON nulls kept as raw messages into nil.
func (o *Operation) normalize() {
	if o == nil {
		return
	}
	o.Metadata = nullToNil(o.Metadata)
	if o.Outcome != nil {
		o.Outcome.Response = nullToNil(o.Outcome.Response)
	}
}

func nullToNil(raw json.RawMessage) json.RawMessage {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	return raw
}

// ValidOperationName reports whether name is an operation name idemgate accepts: 1 to
// MaxOperationNameChars characters of [A-Za-z0-9._:-] (docs/reference.md §4). The proxy and
// the MCP gateway check their configured and derived names with it, so a bad one is a
// configuration error at start, not a refusal of every request.
func ValidOperationName(name string) bool {
	if name == "" || len(name) > MaxOperationNameChars {
		return false
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("._:-", r)) {
			return false
		}
	}
	return true
}
