package services

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/google/uuid"
	"github.com/idemgate/idemgate/models"
)

// DefaultMaxTTL is the largest ttl_seconds accepted unless configured otherwise (docs/reference.md §4).
const DefaultMaxTTL = 30 * 24 * time.Hour

// MaxTTLSeconds is the largest ttl_seconds any configuration may allow: 2^31-1 seconds (about
// 68 years), the largest value PostgreSQL's acquire function takes in its integer (int4) TTL
// parameter. SQLite could hold more, but both stores must give the same answer, so a larger
// ttl_seconds is refused as invalid_request on both before any store call.
const MaxTTLSeconds = math.MaxInt32

// MaxTTL is MaxTTLSeconds as a duration: the ceiling of a configured maximum TTL
// (IDEMGATE_MAX_TTL is refused at start above it; NewAdmission cuts a larger one to it).
const MaxTTL = MaxTTLSeconds * time.Second

// Admission decides admission and records outcomes and releases (docs/reference.md §3–4). It is safe for
// concurrent use by any number of goroutines and server processes sharing one database.
type Admission struct {
	db     *models.DB
	st     store
	log    *slog.Logger
	maxTTL time.Duration
	obs    Observer
	linger LingerMode // group admission's, when on
	// policies gives the fields an acquire leaves out (docs/reference.md §2).
	policies *Policies
}

// NewAdmission returns an Admission over db. maxTTL bounds ttl_seconds (0 means
// DefaultMaxTTL; above MaxTTL it is cut to MaxTTL, which the configuration refuses at start
// anyway). It reports its decisions to nobody; see WithObserver.
func NewAdmission(db *models.DB, log *slog.Logger, maxTTL time.Duration) *Admission {
	if maxTTL <= 0 {
		maxTTL = DefaultMaxTTL
	}
	maxTTL = min(maxTTL, MaxTTL)
	return &Admission{db: db, st: newStore(db), log: log, maxTTL: maxTTL, obs: nopObserver{}, policies: NewPolicies(db, log)}
}

// WithPolicies returns a copy of a that reads its tenants' policies through ps, so that a
// change made through ps applies to a's acquires at once (services.New shares one). a itself
// is not changed.
func (a *Admission) WithPolicies(ps *Policies) *Admission {
	b := *a
	b.policies = ps
	return &b
}

// WithGroupAdmission returns a copy of a that gathers concurrent acquires into one statement
// and one commit (on) or decides each alone (off); see grouper in group.go. New Admissions
// decide each alone (tests and tools that want one statement per acquire); `idemgate serve`
// turns grouping on unless IDEMGATE_GROUP_ADMISSION=false. a itself is not changed.
func (a *Admission) WithGroupAdmission(on bool) *Admission {
	c := *a
	base := a.st
	if gs, ok := base.(groupedStore); ok {
		base = gs.store
	}
	c.st = base
	if on {
		c.st = groupedStore{store: base, g: base.grouper(c.linger)}
	}
	return &c
}

// WithLinger returns a copy of a whose group admission lingers as mode says (LingerMode; the
// default is LingerOff), in either order with WithGroupAdmission. a itself is not changed.
func (a *Admission) WithLinger(mode LingerMode) *Admission {
	c := *a
	c.linger = mode
	_, grouped := a.st.(groupedStore)
	return c.WithGroupAdmission(grouped)
}

// GroupStats counts group admission's work since the process started: Batches is the number
// of statements that decided more than one acquire, Items the acquires in them, Singles the
// acquires decided in a statement of their own (the slot was free, or they were the only one
// waiting when it came free), and Contended the statements undone because one of their
// acquires would have waited on a row lock (PostgreSQL; those acquires are in Items and were
// then decided alone, outside the slot). All zero when grouping is off. Items/Batches is the
// mean size of the statements of several acquires, (Items+Singles)/(Batches+Singles) the mean
// acquires per statement; a Singles share near 1 means acquires rarely wait for one another.
//
// Busy is the time the statements sent from the statement slot took, summed (Batches+Singles
// statements; wall time from sending to the last row read, so execution and commit), and
// Busy/(Batches+Singles) a statement's mean latency. Its rate against wall time is the slot's
// occupancy (one slot per process). Below 1, some acquires find the slot free and go alone. Near
// 1, every acquire waits for the statement in flight and goes in the next: its latency includes
// that wait, and the instance's rate grows with load only as the batches grow (what make bench
// measured: docs/operations.md "Figures behind the code").
//
// Linger is the time the slot spent lingering (LingerMode: waiting, with no statement
// running, for the callers just answered to come back), summed; not in Busy. LingersGathered
// counts the lingers that gathered at least half the acquires they waited for,
// LingersExpired those that ended at their bound with fewer (under LingerAuto, each makes the
// slot skip lingers for a while).
type GroupStats struct {
	Batches, Items, Singles, Contended int64
	Busy, Linger                       time.Duration
	LingersGathered, LingersExpired    int64
}

// GroupStats returns a's group admission counters (see GroupStats).
func (a *Admission) GroupStats() GroupStats {
	gs, ok := a.st.(groupedStore)
	if !ok {
		return GroupStats{}
	}
	g := gs.g
	return GroupStats{Batches: g.nBatches.Load(), Items: g.nItems.Load(), Singles: g.nSingles.Load(),
		Contended: g.nContended.Load(), Busy: time.Duration(g.busyNanos.Load()),
		Linger: time.Duration(g.lingerNanos.Load()), LingersGathered: g.nGathered.Load(), LingersExpired: g.nExpired.Load()}
}

// AcquireInput is an acquire request (docs/reference.md §4 "POST /v1/acquire"). Nil pointers are absent
// fields. Metadata, when set, must be a JSON object.
type AcquireInput struct {
	Key string
	// TTLSeconds is the hold's TTL; 0 (absent) takes the TTL of the policy in force for the
	// operation (docs/reference.md §2), and without one the acquire is invalid.
	TTLSeconds    int64
	Operation     *string
	Fingerprint   *string
	CorrelationID *string
	AttemptID     *string
	Metadata      json.RawMessage
	// LeaseSeconds is how long the admitted attempt may run without an outcome before it is
	// presumed crashed (docs/reference.md §8): 1 to TTLSeconds; nil means TTLSeconds.
	LeaseSeconds *int64
	// OnExpiry is OnExpiryReadmit (nil means it) or OnExpiryHold.
	OnExpiry *string
}

// leaseSeconds is in's lease in seconds: LeaseSeconds, or the TTL when absent.
func (in *AcquireInput) leaseSeconds() int64 {
	if in.LeaseSeconds != nil {
		return *in.LeaseSeconds
	}
	return in.TTLSeconds
}

// onExpiry is in's expiry policy: OnExpiry, or OnExpiryReadmit when absent.
func (in *AcquireInput) onExpiry() string {
	if in.OnExpiry != nil {
		return *in.OnExpiry
	}
	return OnExpiryReadmit
}

// ttlCeilingSeconds is the largest ttl_seconds, and renew lease_seconds, that maxTTL (the
// configured maximum TTL) allows, in whole seconds and never above MaxTTLSeconds.
func ttlCeilingSeconds(maxTTL time.Duration) int64 {
	return min(int64(maxTTL/time.Second), MaxTTLSeconds)
}

// validate checks in against docs/reference.md's limits and returns the compacted metadata. All field
// problems are reported at once.
func (in *AcquireInput) validate(maxTTL time.Duration) (json.RawMessage, error) {
	var fe []FieldError
	add := func(field, msg string) {
		if msg != "" {
			fe = append(fe, FieldError{Field: field, Message: msg})
		}
	}
	add("key", ValidateKey(in.Key))
	maxSecs := ttlCeilingSeconds(maxTTL)
	switch {
	case in.TTLSeconds == 0:
		add("ttl_seconds", "is required: no policy of the tenant gives a TTL for this operation")
	case in.TTLSeconds < 1 || in.TTLSeconds > maxSecs:
		add("ttl_seconds", fmt.Sprintf("must be an integer from 1 to %d", maxSecs))
	}
	if in.Operation != nil {
		add("operation", ValidateOperationName(*in.Operation))
	}
	if in.Fingerprint != nil {
		add("fingerprint", validateText(*in.Fingerprint, MaxFingerprintChars, false))
	}
	if in.CorrelationID != nil {
		add("correlation_id", validateText(*in.CorrelationID, MaxCorrelationIDChars, false))
	}
	if in.AttemptID != nil {
		add("attempt_id", validateText(*in.AttemptID, MaxAttemptIDChars, false))
	}
	if in.LeaseSeconds != nil && (*in.LeaseSeconds < 1 || *in.LeaseSeconds > in.TTLSeconds) {
		add("lease_seconds", "must be an integer from 1 to ttl_seconds")
	}
	if in.OnExpiry != nil && *in.OnExpiry != OnExpiryReadmit && *in.OnExpiry != OnExpiryHold {
		add("on_expiry", "must be readmit or hold_until_reconciled")
	}
	var meta json.RawMessage
	if in.Metadata != nil && string(in.Metadata) != "null" {
		m, msg := validateJSON(in.Metadata, true)
		if msg == "" && len(m) > MaxMetadataBytes {
			msg = fmt.Sprintf("must be at most %d bytes serialized", MaxMetadataBytes)
		}
		add("metadata", msg)
		meta = m
	}
	if len(fe) > 0 {
		return nil, invalid(fe...)
	}
	return meta, nil
}

// Acquire asks whether this attempt may run the operation named by in.Key in p's tenant
// (docs/reference.md §4). It returns an Acquisition with Admitted true (201, always with State
// in_progress: "run the effect now") for a free key or an attempt_id retry, Admitted false with
// the holder's Operation for a duplicate (200), or an
// error: ErrInvalidRequest with Fields, ErrFingerprintMismatch (422) for a held key with a
// different fingerprint or operation name, ErrOutcomeUncertain with Operation set (409) for a
// key whose operation is uncertain and still protects it (docs/reference.md §8: its lease
// lapsed, or its policy is hold_until_reconciled), ErrStoreUnavailable. Every call that passes
// validation is logged as an attempt in the same transaction as the decision.
//
// An attempt_id retry (the key held by the operation that in.AttemptID created) gets that
// operation back, with a fresh owner token, only when p is the API key that created it
// (p.APIKeyID) and the operation is still in_progress. Every key of a tenant can read
// attempt_ids from the attempt log, so from any other key the attempt_id counts as absent
// (duplicate or ErrFingerprintMismatch) and cannot take an owner token; and once the
// operation has an outcome, whoever set it, a 201 would tell the caller to run the effect
// again, so the retry is an ordinary duplicate, logged as one.
func (a *Admission) Acquire(ctx context.Context, p Principal, in AcquireInput) (*Acquisition, error) {
	life, err := a.policies.applyTo(ctx, p.TenantID, &in, ttlCeilingSeconds(a.maxTTL))
	if err != nil {
		return nil, storeError("acquire: read policies", err)
	}
	meta, err := in.validate(a.maxTTL)
	if err != nil {
		return nil, err
	}
	owner := newSecret(ownerTokenPrefix)
	d, err := a.st.acquire(ctx, acquireArgs{p: p, in: in, meta: meta, opID: newOperationID(), ownerHash: hashSecret(owner), life: life})
	if err != nil {
		return nil, storeError("acquire", err)
	}
	if err := a.previousOnRetry(ctx, []*decision{&d}); err != nil {
		return nil, storeError("acquire", err)
	}
	return a.answer(ctx, p, in, d, owner, false)
}

// MaxBatchItems is the most items one AcquireBatch may carry.
const MaxBatchItems = 500

// BatchItem is one item's answer in AcquireBatch: exactly what Acquire would have answered for
// it alone, either Acquisition or Err (ErrInvalidRequest with Fields, ErrFingerprintMismatch).
type BatchItem struct {
	Acquisition *Acquisition
	Err         error
}

// AcquireBatch decides items, in order, in p's tenant, as one database round trip and one
// transaction (docs/reference.md §9). Items are independent: each gets the answer Acquire would have
// given it (an invalid item is refused alone and logs no attempt), and two items with the same
// key are decided in order, the second seeing the first. Every valid item is logged as an
// attempt in the transaction of its decision. Errors for the whole batch: ErrInvalidRequest
// (no items, or more than MaxBatchItems), ErrStoreUnavailable (nothing was decided, or, if a
// commit was cut off, every item's attempt_id retry gets its operation back).
func (a *Admission) AcquireBatch(ctx context.Context, p Principal, items []AcquireInput) ([]BatchItem, error) {
	if len(items) < 1 || len(items) > MaxBatchItems {
		return nil, invalid(FieldError{Field: "items", Message: fmt.Sprintf("must hold 1 to %d acquire requests", MaxBatchItems)})
	}
	out := make([]BatchItem, len(items))
	args := make([]acquireArgs, 0, len(items))
	idx := make([]int, 0, len(items))
	owners := make([]string, 0, len(items))
	type retry struct{ key, attemptID string }
	seen := map[retry]bool{}
	for i, in := range items {
		life, err := a.policies.applyTo(ctx, p.TenantID, &in, ttlCeilingSeconds(a.maxTTL))
		if err != nil {
			return nil, storeError("acquire batch: read policies", err)
		}
		meta, err := in.validate(a.maxTTL)
		if err != nil {
			out[i].Err = err
			continue
		}
		if in.AttemptID != nil {
			// docs/reference.md §9: a key and attempt_id the batch already carried is not a
			// retry of a lost answer (the answer is in this very response) but a repeat; as a
			// retry it would take a second owner token, killing the first item's, and tell the
			// caller twice to run the effect. Decided, and logged, as the same request without
			// an attempt_id: a duplicate naming the first item's operation.
			r := retry{in.Key, *in.AttemptID}
			if seen[r] {
				in.AttemptID = nil
			}
			seen[r] = true
		}
		owner := newSecret(ownerTokenPrefix)
		args = append(args, acquireArgs{p: p, in: in, meta: meta, opID: newOperationID(), ownerHash: hashSecret(owner), life: life})
		idx = append(idx, i)
		owners = append(owners, owner)
	}
	if len(args) == 0 {
		return out, nil
	}
	ds, err := a.st.acquireBatch(ctx, args)
	if err != nil {
		return nil, storeError("acquire batch", err)
	}
	retried := make([]*decision, len(ds))
	for j := range ds {
		retried[j] = &ds[j]
	}
	if err := a.previousOnRetry(ctx, retried); err != nil {
		return nil, storeError("acquire batch", err)
	}
	for j, d := range ds {
		i := idx[j]
		out[i].Acquisition, out[i].Err = a.answer(ctx, p, items[i], d, owners[j], true)
	}
	return out, nil
}

// previousOnRetry fills in previous_operation for the attempt_id retries among ds
// (readmitted): the store names the previous generation only when it takes a key over, and a
// retry must carry the warning its first answer carried (docs/reference.md §4; issue 28). The
// warned generation is warnedGeneration's, as it is now: if it has been reconciled since the
// first answer, the warning follows its new state (reconciled failed: no warning, or one about
// an older generation still in doubt). The purge keeps a succeeded generation while a later
// one holds its key (Reaper.purgeWalk), so a retry finds it. One query for all of ds, and
// none when there is no retry among them.
func (a *Admission) previousOnRetry(ctx context.Context, ds []*decision) error {
	var ids []string
	byID := map[string]*decision{}
	for _, d := range ds {
		if d.readmitted && d.prev == nil {
			ids = append(ids, d.op.ID)
			byID[d.op.ID] = d
		}
	}
	if len(ids) == 0 {
		return nil
	}
	var rows []struct {
		NextID         string
		ID             string
		State          string
		FencingToken   int64
		OutcomeStatus  *string
		OutcomeReceipt *string
	}
	qctx, cancel := a.db.Bounded(ctx)
	defer cancel()
	err := a.db.WithContext(qctx).Table("operations AS n").
		Joins("JOIN operations o ON o.key_id = n.key_id AND o.fencing_token = "+
			"(SELECT MAX(e.fencing_token) FROM operations e WHERE e.key_id = n.key_id "+
			"AND e.fencing_token < n.fencing_token AND e.state IN ?)", duplicateEffectStates).
		Where("n.id IN ?", ids).
		Select("n.id AS next_id, o.id, o.state, o.fencing_token, o.outcome_status, o.outcome_receipt").
		Scan(&rows).Error
	if err != nil {
		return err
	}
	for _, r := range rows {
		byID[r.NextID].prev = &PreviousOperation{ID: r.ID, State: r.State, FencingToken: r.FencingToken,
			OutcomeStatus: r.OutcomeStatus, OutcomeReceipt: r.OutcomeReceipt}
	}
	return nil
}

// answer turns a store's decision on in into what the caller is told, and reports it to the
// Observer; inBatch says the decision is an item of AcquireBatch.
func (a *Admission) answer(ctx context.Context, p Principal, in AcquireInput, d decision, owner string, inBatch bool) (*Acquisition, error) {
	acq, err := reply(in, d, owner)
	a.obs.AcquireDecided(ctx, p.TenantName, d.result, acquireDecision(in.Key, inBatch, acq, err))
	return acq, err
}

// acquireDecision is the Observer's Decision of an acquire of key answered with acq or err.
func acquireDecision(key string, inBatch bool, acq *Acquisition, err error) Decision {
	dec := Decision{Key: key, InBatch: inBatch}
	var de *Error
	switch {
	case err != nil:
		if errors.As(err, &de) {
			dec.Refused = de.Code
		}
	case acq.Admitted:
		dec.OperationID, dec.FencingToken = acq.OperationID, acq.FencingToken
	case acq.Operation != nil:
		dec.OperationID, dec.FencingToken = acq.Operation.ID, acq.Operation.FencingToken
	}
	return dec
}

// reply is what the caller of an acquire of in is told of the store's decision d; owner is the
// owner token of an admission.
func reply(in AcquireInput, d decision, owner string) (*Acquisition, error) {
	switch d.result {
	case ResultConflict:
		return nil, ErrFingerprintMismatch
	case ResultDuplicate:
		if answersOutcomeUncertain(&d.op) {
			op := d.op
			return nil, &Error{Code: CodeOutcomeUncertain, Operation: &op,
				Message: "The key's operation has an uncertain outcome; it is not admitted again until it is reconciled or its protection ends."}
		}
		return &Acquisition{Admitted: false, Key: in.Key, Operation: &d.op}, nil
	}
	acq := &Acquisition{
		Admitted:         true,
		Readmitted:       d.readmitted,
		Key:              in.Key,
		OperationID:      d.op.ID,
		OwnerToken:       owner,
		FencingToken:     d.op.FencingToken,
		State:            d.op.State,
		ExpiresAt:        d.op.ExpiresAt,
		LeaseExpiresAt:   d.op.LeaseExpiresAt,
		OnExpiry:         d.op.OnExpiry,
		RetentionSeconds: d.op.RetentionSeconds,
		HorizonSeconds:   d.op.HorizonSeconds,
		// From the operation, not the request: an attempt_id retry gets the operation it
		// created back, with the hold and lease it was granted (whole seconds, rounded down).
		TTLSeconds:   int64(d.op.ExpiresAt.Sub(d.op.AcquiredAt) / time.Second),
		LeaseSeconds: int64(d.op.LeaseExpiresAt.Sub(d.op.AcquiredAt) / time.Second),
	}
	if d.prev != nil && mayDuplicateEffect(d.prev.State) {
		acq.PreviousOperation = d.prev
	}
	return acq, nil
}

// newOperationID is the id of an operation an acquire may create: a UUIDv7 (RFC 9562 §5.7),
// whose leading 48 bits are the Unix time in milliseconds, so the operations primary key and
// attempts(operation_id) grow at their right edge like a sequence instead of taking each id on a
// random page of the B-tree: more acquires a second and a smaller index than with UUIDv4
// (measured: docs/operations.md "Figures behind the code"). The ids carry no secret (the owner
// token is the credential, and the acquire time they reveal is in the answer anyway) and keep 62
// random bits after a 12-bit counter that orders ids within one millisecond in this process, so
// ids of different processes still differ.
func newOperationID() string { return uuid.Must(uuid.NewV7()).String() }
