// Package playback walks one idempotency key of a sandbox tenant through its life, one step at
// a time, for the dashboard's Explore page (docs/reference.md §5 "Explore"): acquire, duplicate,
// fingerprint mismatch, TTL expiry to uncertain, the retry that carries the warning, the
// outcome, a late owner-checked release, and the operator's reconciliation.
//
// Every step is a real call of the services the JSON API and the dashboard use, against a
// store of its own (an SQLite file in a temporary directory, opened at first use, replaced
// when full or failed), never the deployment's database: nothing played here reaches another
// tenant's counts, webhooks, audit or metrics. Each playback has a tenant of its own in that
// store. The TTL step moves the key's deadlines (models.DB.Elapse) instead of making the
// operator wait.
//
// The package records what each call was given and what it answered, as services values; the
// HTTP layer (web) renders them as the API's requests and answers, so the page shows exactly
// the wire format web serves.
package playback

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/idemgate/idemgate/services"
)

// Steps is how many steps a playback has (docs/reference.md §5 "Explore").
const Steps = 8

// TTL is the hold the playback's attempts ask for (ttl_seconds 300): a realistic payment
// window, long enough that the operator reading steps 2 and 3 never sees it run out in real
// time. Step 4 moves the sandbox's clock by TTL instead of waiting for it.
const TTL = 5 * time.Minute

// freshFor is how old an admission may be when a step that needs its hold runs (holdOf):
// past it the hold could have expired in real time, and a duplicate would be admitted
// instead of refused, so the playback starts again on a new key.
const freshFor = TTL - time.Minute

// holdOf maps each step that needs a live hold to the step whose admission holds the key:
// steps 2 and 3 meet attempt 1's hold, steps 6 and 7 attempt 2's (a duplicate within the
// TTL gets the stored outcome; the late release meets the current holder).
var holdOf = map[int]int{2: 1, 3: 1, 6: 5, 7: 5}

// maxRuns bounds the playbacks one process keeps, and maxRunsPerAccount those of one
// account; the least recently shown is forgotten first (what it played stays in the sandbox
// until the sandbox is replaced).
const (
	maxRuns           = 1024
	maxRunsPerAccount = 8
)

// playbackKey is every playback's idempotency key, named after the business operation and
// its object as the README advises; each playback has a tenant of its own, so the name is
// its own there.
const playbackKey = "charge:order-5521"

// The operation name and the two parameter sets of the playback's charge. The fingerprint is
// the SHA-256 of the parameters, as a client would compute it.
const (
	operationName = "charge"
	bodyCharge    = `{"amount":4200,"currency":"EUR","customer":"cus_7"}`
	bodyOther     = `{"amount":5000,"currency":"EUR","customer":"cus_7"}`
	receipt       = "ch_3PqL8s2eZvKYlo2C"
)

// SandboxOperator is the operator step 8's reconciliation is recorded under when the viewer's
// own role is read-only (auditor).
const SandboxOperator = "sandbox-operator"

// ErrClosed is returned once the Player is closed (the server is shutting down).
var ErrClosed = errors.New("playback: closed")

// Call names which request of the API (or of the dashboard) an Exchange stands for.
type Call int

// The calls of a playback.
const (
	// CallAcquire is POST /v1/acquire with Exchange.Acquire.
	CallAcquire Call = iota + 1
	// CallListUncertain is GET /v1/operations?state=uncertain.
	CallListUncertain
	// CallClock is no request: the sandbox's clock moves by Exchange.Elapsed and its reaper
	// makes a pass (Exchange.Reaped).
	CallClock
	// CallOutcome is POST /v1/operations/{Exchange.OperationID}/outcome with Exchange.Outcome.
	CallOutcome
	// CallRelease is POST /v1/release with Exchange.Release.
	CallRelease
	// CallReconcile is the dashboard's form POST /operations/{Exchange.OperationID}/outcome
	// with Exchange.Reconcile (the API's POST /v1/reconciliations does the same for automation).
	CallReconcile
	// CallGetOperation is GET /v1/operations/{Exchange.OperationID}.
	CallGetOperation
)

// Exchange is one call of a step: what it was given and what the services answered. Exactly
// the input fields of its Call are set, and either Err or the result fields of the Call.
type Exchange struct {
	Call        Call
	OperationID string
	Acquire     *services.AcquireInput
	Outcome     *services.OutcomeInput
	Release     *services.ReleaseInput
	Reconcile   *services.ReconcileInput
	// Elapsed is how far CallClock moved the sandbox's clock.
	Elapsed time.Duration

	Acquisition *services.Acquisition      // CallAcquire
	Operation   *services.Operation        // CallOutcome, CallRelease, CallReconcile
	Detail      *services.OperationDetail  // CallGetOperation
	Queue       []services.QueuedOperation // CallListUncertain
	QueueNext   string                     // CallListUncertain: the next page's cursor ("" for none)
	Reaped      services.ReapResult        // CallClock
	// Err is the services' refusal (a *services.Error, rendered as problem+json) or failure.
	Err error
	// RequestID is the id the API would have given the request (X-Request-ID, a problem's
	// request_id): a UUID made when the call was played.
	RequestID string
}

// Code is the stable error code of e.Err ("" when the call was not refused).
func (e *Exchange) Code() string {
	var de *services.Error
	if errors.As(e.Err, &de) {
		return de.Code
	}
	return ""
}

// refusal reports whether err is an answer a step shows (a 4xx of the API: the fingerprint
// mismatch, the owner check), as opposed to a failure of the sandbox's store, which no step
// expects and none records.
func refusal(err error) bool {
	var de *services.Error
	if !errors.As(err, &de) {
		return false
	}
	switch de.Code {
	case services.CodeStoreUnavailable, services.CodeInternal, services.CodeTooManyWaiters:
		return false
	}
	return true
}

// Step is one step of a playback as it was played.
type Step struct {
	// N is the step's number, 1 to Steps.
	N         int
	Exchanges []Exchange
	// Timeline is the key's generations after the step, oldest (fencing token 1) first.
	Timeline []services.Operation
	// PlayedAt is when the step ran (UTC).
	PlayedAt time.Time
}

// Playback is one walk of one key, as far as it has been played.
type Playback struct {
	// ID identifies the playback (a UUID); the page carries it in its URL.
	ID string
	// Key is the playback's idempotency key in the sandbox, its own for each playback.
	Key string
	// Tenant is the playback's own tenant in the sandbox (TenantPrefix and 12 hex digits; ""
	// before step 1).
	Tenant string
	// Steps are the steps played so far, in order.
	Steps []Step
	// Restarted is set when the steps had to be played again on a new key: the playback was
	// not in this process (a restart, or another instance answered) or a hold a step needs
	// would have run out in real time (holdOf).
	Restarted bool
}

// Player plays playbacks in its sandbox. It is safe for concurrent use; each playback is
// played by one goroutine at a time, and playing a step that was already played returns the
// recorded step again, so two tabs (or a reload) never play a step twice.
type Player struct {
	sandbox lazySandbox
	mu      sync.Mutex
	runs    map[runRef]*run
	now     func() time.Time
}

type runRef struct {
	owner int64
	id    string
}

type run struct {
	mu       sync.Mutex
	pb       Playback
	lastSeen time.Time
	// sb and principal are the sandbox and the tenant the steps were played in (nil before
	// step 1).
	sb        *sandbox
	principal services.Principal
	ops       [2]struct{ id, ownerToken string } // the two generations' operation ids and owner tokens
}

// New returns a Player whose sandbox is opened at first use. log receives the sandbox's
// services' logs (its reaper's passes), tagged store=playback-sandbox; nil logs nothing.
func New(log *slog.Logger) *Player {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Player{sandbox: lazySandbox{log: log.With("store", "playback-sandbox")}, runs: map[runRef]*run{}, now: time.Now}
}

// Close stops the sandbox's reaper and removes its store; Play answers ErrClosed from then on.
func (p *Player) Close() error { return p.sandbox.close() }

// Play plays playback id of the account owner up to step upTo (0 to Steps; larger is Steps)
// and returns it. Steps already played are not played again: they are returned as recorded,
// and Playback.Steps may hold more than upTo steps (the page shows upTo of them). A playback
// this process does not know (a new id, a restart, another instance) is played from step 1
// on a new key. viewer is the signed-in operator: one account's playbacks are never
// another's, and step 8's reconciliation is recorded under its username when its role may
// act (admin, operator), else under SandboxOperator, as an auditor could not record it.
//
// A step whose call fails (the sandbox's store, not a refusal the step shows) is not
// recorded: the error is returned, the sandbox is replaced by a fresh one, and the next call
// plays the playback again from step 1 on the new one. Errors: ErrClosed; the sandbox's
// store failing to open or answer; ctx's.
func (p *Player) Play(ctx context.Context, viewer *services.OperatorAccount, id string, upTo int) (*Playback, error) {
	upTo = min(max(upTo, 0), Steps)
	sb, err := p.sandbox.get(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { p.sandbox.release(sb) }()
	r, known := p.run(viewer.ID, id)
	r.mu.Lock()
	defer r.mu.Unlock()
	// Step 1 of a new id is how every playback starts; any later step of an id this process
	// never played is a playback begun elsewhere, whose earlier answers the page showed with
	// other ids and owner tokens.
	if !known && upTo > 1 {
		r.pb.Restarted = true
	}
	// A read-only viewer watches an operator act; the outcome is not recorded in its name.
	actor := viewer.Username
	if !services.MayAct(viewer) {
		actor = SandboxOperator
	}
	for len(r.pb.Steps) < upTo {
		n := len(r.pb.Steps) + 1
		if r.sb != nil && r.sb != sb { // played in a sandbox since replaced
			r.restart()
			continue
		}
		if h, ok := holdOf[n]; ok && p.now().Sub(r.pb.Steps[h-1].PlayedAt) > freshFor {
			r.restart()
			continue
		}
		if n == 1 {
			if sb.tenants.Load() >= maxTenantsPerSandbox {
				p.sandbox.retire(sb, "full")
				p.sandbox.release(sb)
				if sb, err = p.sandbox.get(ctx); err != nil {
					sb = nil
					return nil, err
				}
			}
			if r.principal, err = sb.newTenant(ctx); err != nil {
				return nil, p.failed(ctx, r, sb, err)
			}
			r.sb, r.pb.Tenant = sb, r.principal.TenantName
		}
		st, err := r.play(ctx, actor, n)
		if err != nil {
			return nil, p.failed(ctx, r, sb, err)
		}
		st.PlayedAt = p.now().UTC()
		r.pb.Steps = append(r.pb.Steps, *st)
	}
	out := r.pb
	out.Steps = append([]Step(nil), r.pb.Steps...)
	return &out, nil
}

// failed handles a step whose call failed: the playback starts again, and the sandbox is
// replaced unless the caller merely went away (ctx canceled), since a store that fails once
// (locked, full, its file deleted) may keep failing. A deadline that passed is the store
// failing to answer in time, not the caller giving up. It returns err.
func (p *Player) failed(ctx context.Context, r *run, sb *sandbox, err error) error {
	r.restart()
	if !errors.Is(ctx.Err(), context.Canceled) {
		p.sandbox.retire(sb, err.Error())
	}
	return err
}

// run finds or creates playback id of owner. A new one beyond maxRunsPerAccount forgets the
// account's least recently shown playback, and beyond maxRuns anyone's, so one account
// cannot push the others' playbacks out. known is false for a new run.
func (p *Player) run(owner int64, id string) (_ *run, known bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ref := runRef{owner, id}
	now := p.now()
	if r, ok := p.runs[ref]; ok {
		r.lastSeen = now
		return r, true
	}
	p.forgetOldest(func(k runRef) bool { return k.owner == owner }, maxRunsPerAccount)
	p.forgetOldest(func(runRef) bool { return true }, maxRuns)
	r := &run{lastSeen: now, pb: Playback{ID: id}}
	r.restart()
	r.pb.Restarted = false
	p.runs[ref] = r
	return r, false
}

// forgetOldest forgets the least recently shown run among those of, if they are limit or
// more. p.mu is held.
func (p *Player) forgetOldest(of func(runRef) bool, limit int) {
	n := 0
	var oldest runRef
	var at time.Time
	for k, r := range p.runs {
		if !of(k) {
			continue
		}
		n++
		if at.IsZero() || r.lastSeen.Before(at) {
			oldest, at = k, r.lastSeen
		}
	}
	if n >= limit {
		delete(p.runs, oldest)
	}
}

// restart forgets the steps played; the next step 1 makes a new tenant, with the same key.
func (r *run) restart() {
	r.pb.Key = playbackKey
	r.pb.Tenant = ""
	r.pb.Steps = nil
	r.pb.Restarted = true
	r.sb, r.principal = nil, services.Principal{}
	r.ops = [2]struct{ id, ownerToken string }{}
}

// fingerprint is the SHA-256 of a request body, hex, as a client computes it.
func fingerprint(body string) *string {
	sum := sha256.Sum256([]byte(body))
	s := "sha256:" + hex.EncodeToString(sum[:])
	return &s
}

func (r *run) acquire(body string) services.AcquireInput {
	name := operationName
	return services.AcquireInput{Key: r.pb.Key, TTLSeconds: int64(TTL / time.Second), Operation: &name,
		Fingerprint: fingerprint(body)}
}

// play plays step n. A refusal the step expects is recorded in its Exchange; only a failure
// of the sandbox itself (its store) is returned.
func (r *run) play(ctx context.Context, username string, n int) (*Step, error) {
	sb, p := r.sb, r.principal
	adm := sb.svc.Admission
	st := &Step{N: n}
	// failure is the first call that failed in the store; the step's later calls are not
	// made, so a locked store costs one store timeout, not one per call.
	var failure error
	add := func(ex Exchange) *Exchange {
		ex.RequestID = uuid.NewString()
		if ex.Err != nil && !refusal(ex.Err) && failure == nil {
			failure = ex.Err
		}
		st.Exchanges = append(st.Exchanges, ex)
		return &st.Exchanges[len(st.Exchanges)-1]
	}
	acquire := func(in services.AcquireInput) *Exchange {
		if failure != nil {
			return &Exchange{}
		}
		acq, err := adm.Acquire(ctx, p, in)
		return add(Exchange{Call: CallAcquire, Acquire: &in, Acquisition: acq, Err: err})
	}
	getOp := func(id string) {
		if failure != nil {
			return
		}
		d, err := sb.svc.Reads.GetOperation(ctx, p.TenantID, id)
		add(Exchange{Call: CallGetOperation, OperationID: id, Detail: d, Err: err})
	}
	listUncertain := func() {
		if failure != nil {
			return
		}
		page, err := sb.svc.Reads.ListOperations(ctx, p.TenantID, services.OperationFilter{State: services.StateUncertain})
		ex := Exchange{Call: CallListUncertain, Err: err}
		if page != nil {
			ex.Queue, ex.QueueNext = page.Items, page.NextCursor
		}
		add(ex)
	}
	switch n {
	case 1: // acquire: admitted, fencing token 1
		ex := acquire(r.acquire(bodyCharge))
		if ex.Acquisition != nil && ex.Acquisition.Admitted {
			r.ops[0].id, r.ops[0].ownerToken = ex.Acquisition.OperationID, ex.Acquisition.OwnerToken
		}
	case 2: // the same request again: a duplicate, naming the holder
		acquire(r.acquire(bodyCharge))
	case 3: // the same key with other parameters: fingerprint mismatch
		acquire(r.acquire(bodyOther))
	case 4: // the TTL passes with no outcome: uncertain, in the reconciliation queue
		ex := Exchange{Call: CallClock, Elapsed: TTL}
		if _, ex.Err = sb.db.Elapse(ctx, p.TenantID, TTL, r.pb.Key); ex.Err == nil {
			ex.Reaped, ex.Err = sb.svc.Reaper.RunOnce(ctx)
		}
		add(ex)
		listUncertain()
	case 5: // a retry after expiry: admitted again, fencing token 2, with previous_operation
		ex := acquire(r.acquire(bodyCharge))
		if ex.Acquisition != nil && ex.Acquisition.Admitted {
			r.ops[1].id, r.ops[1].ownerToken = ex.Acquisition.OperationID, ex.Acquisition.OwnerToken
		}
	case 6: // the new holder records succeeded; duplicates now get the stored outcome
		rc := receipt
		in := services.OutcomeInput{OwnerToken: r.ops[1].ownerToken, Status: services.StateSucceeded, Receipt: &rc,
			Response: json.RawMessage(`{"charge":"` + receipt + `","status":"paid"}`)}
		op, err := adm.RecordOutcome(ctx, p, r.ops[1].id, in)
		add(Exchange{Call: CallOutcome, OperationID: r.ops[1].id, Outcome: &in, Operation: op, Err: err})
		acquire(r.acquire(bodyCharge))
	case 7: // a late release with the first attempt's owner token: refused, the key untouched
		reason := "worker 1 gave up after its timeout"
		in := services.ReleaseInput{Key: r.pb.Key, OwnerToken: r.ops[0].ownerToken, Reason: &reason}
		op, err := adm.Release(ctx, p, in)
		add(Exchange{Call: CallRelease, Release: &in, Operation: op, Err: err})
	case 8: // an operator reconciles the first operation
		in := services.ReconcileInput{Status: services.StateFailed,
			Note: "The processor has no charge for attempt 1: it timed out before sending. Only " + receipt + " was charged."}
		acct := &services.OperatorAccount{Username: username, Role: services.RoleOperator, TenantID: &p.TenantID}
		op, err := sb.svc.Reconciliation.ReconcileOutcome(ctx, acct, r.ops[0].id, in)
		add(Exchange{Call: CallReconcile, OperationID: r.ops[0].id, Reconcile: &in, Operation: op, Err: err})
		getOp(r.ops[0].id)
		listUncertain()
	}
	if failure != nil {
		return nil, failure // the sandbox failed; the step is not recorded
	}
	for _, o := range r.ops {
		if o.id == "" {
			continue
		}
		d, err := sb.svc.Reads.GetOperation(ctx, p.TenantID, o.id)
		if err != nil {
			return nil, err
		}
		st.Timeline = append(st.Timeline, d.Operation)
	}
	return st, nil
}
