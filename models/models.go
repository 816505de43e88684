package models

import "time"

// Tenant is a namespace for idempotency keys; every API key belongs to one.
type Tenant struct {
	ID        int64
	Name      string
	CreatedAt time.Time
}

// TableName pins the table name so GORM's pluralisation rules never matter.
func (Tenant) TableName() string { return "tenants" }

// APIKey authenticates a service and decides its tenant. SecretHash is the hex SHA-256 of the
// secret; the secret itself is never stored. Prefix is the secret's first characters, shown to
// operators so they can tell keys apart.
type APIKey struct {
	ID         int64
	TenantID   int64
	Prefix     string
	SecretHash string
	Label      string
	CreatedAt  time.Time
	LastUsedAt *time.Time
	RevokedAt  *time.Time
}

// TableName pins the table name.
func (APIKey) TableName() string { return "api_keys" }

// Operator is a dashboard account. PasswordHash is a bcrypt hash. TenantID nil means a global
// account; otherwise the account sees only that tenant (docs/reference.md §5).
type Operator struct {
	ID           int64
	Username     string
	PasswordHash string
	Role         string
	TenantID     *int64
	CreatedAt    time.Time
}

// TableName pins the table name.
func (Operator) TableName() string { return "operators" }

// Session is one dashboard session as stored by services.SessionStore (fiber session storage).
type Session struct {
	ID        string
	Data      []byte
	ExpiresAt *time.Time
}

// TableName pins the table name.
func (Session) TableName() string { return "sessions" }

// IdemKey is one (tenant, idempotency key) ever acquired. The hold is HolderOperationID plus
// ExpiresAt: both are nil when the key is free, and they are cleared only by compare on
// HolderOperationID (docs/reference.md §6). The row outlives its holds so that FencingToken, the fencing
// token of the newest operation, keeps increasing across generations.
type IdemKey struct {
	ID                int64
	TenantID          int64
	Key               string
	FencingToken      int64
	HolderOperationID *string
	ExpiresAt         *time.Time
	LastOperationID   string
	AcquiredAt        time.Time
	// ProtectedUntil is when the horizon of ProtectedBy ends (that succeeded operation's
	// ended_at plus horizon_seconds, set when it ended, whether or not it is still the key's
	// newest): until then the key refuses a new admission though its TTL is over
	// (docs/reference.md §2 "Lifecycle").
	ProtectedUntil *time.Time
	ProtectedBy    *string
	// The tombstone of ProtectedBy, written by the purge that deleted it within its horizon:
	// its fencing token, state, outcome status and receipt, and the request hash of its
	// operation name and fingerprint (requestHash), so a later acquire is still answered as
	// its duplicate, or refused as another request. Migration 00018.
	TombFencingToken   *int64
	TombState          *string
	TombOutcomeStatus  *string
	TombOutcomeReceipt *string
	TombRequestHash    *int64
}

// TableName pins the table name ("keys" is a reserved word in several SQL dialects).
func (IdemKey) TableName() string { return "idem_keys" }

// Operation is one admitted attempt and its durable evidence (docs/reference.md §2). ID is a UUID string.
// Metadata and OutcomeResponse hold raw JSON text. OwnerTokenHash is the hex SHA-256 of the owner
// token. APIKeyID is the API key whose acquire created the operation, the only caller whose
// attempt_id retry is honoured (nil for operations created before it was recorded). EndedAt is set when the operation reaches a state in which retention may purge it
// (succeeded, failed, released).
type Operation struct {
	ID       string
	TenantID int64
	Key      string
	// KeyID is the operation's key row (IdemKey.ID), unique with FencingToken (operations_key_generation):
	// a key's generations are looked up by it. Key rows are never deleted. Zero is left out of
	// an INSERT, and the database fills it in from TenantID and Key.
	KeyID           int64 `gorm:"default:null"`
	OperationName   *string
	Fingerprint     *string
	CorrelationID   *string
	AttemptID       *string
	APIKeyID        *int64
	Metadata        *string
	State           string
	StateReason     *string
	FencingToken    int64
	OwnerTokenHash  string
	AcquiredAt      time.Time
	ExpiresAt       time.Time
	OutcomeStatus   *string
	OutcomeReceipt  *string
	OutcomeResponse *string
	OutcomeNote     *string
	OutcomeBy       *string
	OutcomeAt       *time.Time
	ReleasedAt      *time.Time
	ReleaseReason   *string
	EndedAt         *time.Time
	// UncertainAt is when the operation became uncertain, set by a database trigger on every
	// path that makes it so (the operations_uncertain_at trigger) and kept after reconciliation; nil if it never
	// was. The reconciliation queue is ordered by it.
	UncertainAt *time.Time
	// DuplicateAttempts and ConflictAttempts count the attempts answered about this operation
	// as duplicate or conflict: on SQLite all of them; on PostgreSQL none (its acquires
	// count in OperationCounter rows), though reads add both.
	DuplicateAttempts int64
	ConflictAttempts  int64
	// LeaseExpiresAt is the end of the admitted attempt's lease (docs/reference.md §8): how long
	// it may run without an outcome before it is presumed crashed and made uncertain. It is at
	// most ExpiresAt; nil (operations written by a pre-release build) means ExpiresAt.
	LeaseExpiresAt *time.Time
	// OnExpiry is the key's policy once the TTL is over: "readmit" or "hold_until_reconciled".
	OnExpiry string `gorm:"default:readmit"`
	// PossibleDuplicateEffect is set when an earlier operation of the key (a lower fencing
	// token) is succeeded or uncertain: this admission may have repeated an effect
	// (docs/reference.md §5 "Audit"). Database triggers decide it at admission and keep it in
	// step with the earlier operations' states (models/sql/*/operations_reflag_later.sql); GORM only reads it.
	PossibleDuplicateEffect bool `gorm:"->"`
	// RetentionSeconds is how long the evidence is kept once the operation ended, and
	// HorizonSeconds how long after a success its key refuses a new admission, as in force when
	// it was admitted (docs/reference.md §2 "Lifecycle"). Nil retention: admitted before
	// migration 00018, kept for IDEMGATE_RETENTION; nil horizon: none.
	RetentionSeconds *int64
	HorizonSeconds   *int64
	// PurgeAfter is EndedAt plus RetentionSeconds, set when the operation ends: the reaper
	// purges it after this time.
	PurgeAfter *time.Time
}

// LeaseEnd returns the end of the operation's lease: LeaseExpiresAt, or ExpiresAt when it has
// none (written before leases existed).
func (o *Operation) LeaseEnd() time.Time {
	if o.LeaseExpiresAt != nil {
		return *o.LeaseExpiresAt
	}
	return o.ExpiresAt
}

// TableName pins the table name.
func (Operation) TableName() string { return "operations" }

// Attempt is one call of acquire, whatever its result (docs/reference.md §1.5). OperationID is the
// operation the call was answered about: the new one when admitted, the holder otherwise.
// Caller is the prefix of the API key that made the call.
type Attempt struct {
	ID            int64
	TenantID      int64
	Key           string
	OperationID   *string
	Result        string
	AttemptID     *string
	OperationName *string
	Fingerprint   *string
	CorrelationID *string
	Caller        string
	AttemptedAt   time.Time
}

// TableName pins the table name.
func (Attempt) TableName() string { return "attempts" }

// Event is one entry of an operation's event log: who (Actor: "system", "api" or an operator's
// username) did what (Kind) and when.
type Event struct {
	ID          int64
	OperationID string
	TenantID    int64
	Kind        string
	Actor       string
	Detail      string
	CreatedAt   time.Time
}

// TableName pins the table name.
func (Event) TableName() string { return "events" }

// OperationCounter is one share of an operation's duplicate and conflict counts: PostgreSQL's
// acquire counts each duplicate or conflicting attempt in a row of its own connection (Shard
// is the backend pid), so a retry storm on one key never waits on a shared row. An operation's counts are its own columns plus the sum of its counter rows.
type OperationCounter struct {
	OperationID       string
	Shard             int64
	DuplicateAttempts int64
	ConflictAttempts  int64
}

// TableName pins the table name.
func (OperationCounter) TableName() string { return "operation_counters" }

// WebhookEndpoint is one webhook subscriber of a tenant (docs/reference.md §10 "Webhooks",
// models/sql/*/operations_webhook_*.sql). Events is the comma-separated list of subscribed event types. Secret is the
// "whsec_" signing secret, stored because signing needs it and never returned by a read.
// Deleted endpoints are kept (DeletedAt) so that their deliveries still name them.
type WebhookEndpoint struct {
	ID         int64
	TenantID   int64
	URL        string
	Events     string
	Secret     string
	CreatedBy  string
	CreatedAt  time.Time
	DisabledAt *time.Time
	DeletedAt  *time.Time
	DeletedBy  *string
}

// TableName pins the table name.
func (WebhookEndpoint) TableName() string { return "webhook_endpoints" }

// WebhookEvent is one outbox row: one event for one endpoint, written by a database trigger in
// the transaction of the operation's state change (models/sql/*/operations_webhook_*.sql). MsgID is the Standard
// Webhooks webhook-id, the same on every retry. The Op* fields are the operation as it was at
// the change, so every retry sends the same body. Status is pending, delivered or failed;
// NextAttemptAt is when a pending row is due, and while a dispatcher holds it, the end of that
// claim (ClaimedUntil, by ClaimedBy).
type WebhookEvent struct {
	ID                  int64
	MsgID               string
	TenantID            int64
	EndpointID          int64
	EventType           string
	OperationID         string
	OccurredAt          time.Time
	OpKey               string
	OpName              *string
	OpState             string
	OpStateReason       *string
	OpFencingToken      int64
	OpOutcomeStatus     *string
	OpOutcomeReceipt    *string
	PreviousOperationID *string
	PreviousState       *string
	Status              string
	Attempts            int
	NextAttemptAt       time.Time
	ClaimedUntil        *time.Time
	ClaimedBy           *string
	LastAttemptAt       *time.Time
	LastStatus          *int
	LastError           *string
	DeliveredAt         *time.Time
}

// TableName pins the table name.
func (WebhookEvent) TableName() string { return "webhook_events" }

// ReconciliationJob is one bulk reconciliation: the outcome and note applied
// to a frozen list of operations (OperationIDs, a JSON array of ids), unique per (Scope,
// JobKey) so a resubmitted job is the same job. Status is "running" until every operation
// has an item, then "completed"; Total, Done and Skipped count the items when it completed.
type ReconciliationJob struct {
	ID           string
	Scope        string
	JobKey       string
	TenantID     *int64
	Actor        string
	Status       string
	Outcome      string
	Note         string
	Selection    string
	Filter       *string
	OperationIDs string `gorm:"column:operation_ids"`
	RequestHash  string
	Limited      bool
	Total        int
	Done         int
	Skipped      int
	CreatedAt    time.Time
	FinishedAt   *time.Time
}

// TableName pins the table name.
func (ReconciliationJob) TableName() string { return "reconciliation_jobs" }

// ReconciliationJobItem is what a bulk reconciliation did to one operation: Result "done"
// (reconciled, with its own event) or "skipped" (Detail says why).
type ReconciliationJobItem struct {
	JobID       string `gorm:"primaryKey"`
	OperationID string `gorm:"primaryKey"`
	Result      string
	Detail      string
	CreatedAt   time.Time
}

// TableName pins the table name.
func (ReconciliationJobItem) TableName() string { return "reconciliation_job_items" }

// Policy is a lifecycle policy (docs/reference.md §2): the defaults an acquire of TenantID
// takes for the fields it leaves out, for every operation (OperationName "") or for one
// operation name. Nil fields are not set by this policy. Migration 00018.
type Policy struct {
	ID            int64
	TenantID      int64
	OperationName string
	TTLSeconds    *int64
	LeaseSeconds  *int64
	OnExpiry      *string
	// RetentionSeconds and HorizonSeconds: docs/reference.md §2 "Lifecycle".
	RetentionSeconds *int64
	HorizonSeconds   *int64
	UpdatedAt        time.Time
	UpdatedBy        string
}

// TableName pins the table name so GORM's pluralisation rules never matter.
func (Policy) TableName() string { return "policies" }
