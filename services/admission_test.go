package services

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/models/modeltest"
	"github.com/stretchr/testify/require"
)

func ptr[T any](v T) *T { return &v }

func TestAcquireFreeKeyThenDuplicateThenConflict(t *testing.T) {
	eachDB(t, func(t *testing.T, b *testBundle) {
		ctx := context.Background()
		in := AcquireInput{Key: "order-1", TTLSeconds: 60, Operation: ptr("charge"), Fingerprint: ptr("fp1"),
			Metadata: json.RawMessage(`{"a": 1}`)}
		acq, err := b.adm.Acquire(ctx, b.p, in)
		require.NoError(t, err)
		require.True(t, acq.Admitted)
		require.EqualValues(t, 1, acq.FencingToken)
		require.Equal(t, StateInProgress, acq.State)
		require.NotEmpty(t, acq.OwnerToken)
		require.Nil(t, acq.PreviousOperation)
		require.WithinDuration(t, time.Now().Add(60*time.Second), acq.ExpiresAt, 5*time.Second)

		dup, err := b.adm.Acquire(ctx, b.p, in)
		require.NoError(t, err)
		require.False(t, dup.Admitted)
		require.Equal(t, acq.OperationID, dup.Operation.ID)
		require.EqualValues(t, 1, dup.Operation.DuplicateAttempts)
		require.JSONEq(t, `{"a":1}`, string(dup.Operation.Metadata))
		require.True(t, dup.Operation.Held)

		in.Fingerprint = ptr("fp2")
		_, err = b.adm.Acquire(ctx, b.p, in)
		require.ErrorIs(t, err, ErrFingerprintMismatch)
		in.Fingerprint = nil // absent equals only absent
		_, err = b.adm.Acquire(ctx, b.p, in)
		require.ErrorIs(t, err, ErrFingerprintMismatch)

		page, err := b.reads.ListAttempts(ctx, b.p.TenantID, AttemptFilter{Key: "order-1"})
		require.NoError(t, err)
		var results []string
		for _, a := range page.Items {
			results = append(results, a.Result)
		}
		require.Equal(t, []string{"conflict", "conflict", "duplicate", "admitted"}, results)
	})
}

func TestConcurrentAcquireAdmitsExactlyOne(t *testing.T) {
	eachDB(t, func(t *testing.T, b *testBundle) {
		const n = 40
		for round := 0; round < 3; round++ {
			key := fmt.Sprintf("race-%d", round)
			var wg sync.WaitGroup
			var mu sync.Mutex
			admitted, dups := 0, 0
			errs := []error{}
			start := make(chan struct{})
			for i := 0; i < n; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					acq, err := b.adm.Acquire(context.Background(), b.p, AcquireInput{Key: key, TTLSeconds: 60})
					mu.Lock()
					defer mu.Unlock()
					switch {
					case err != nil:
						errs = append(errs, err)
					case acq.Admitted:
						admitted++
					default:
						dups++
					}
				}()
			}
			close(start)
			wg.Wait()
			require.Empty(t, errs)
			require.Equal(t, 1, admitted)
			require.Equal(t, n-1, dups)
		}
	})
}

func TestExpiredHoldIsReadmittedWithNextFencingToken(t *testing.T) {
	eachDB(t, func(t *testing.T, b *testBundle) {
		ctx := context.Background()
		first, err := b.adm.Acquire(ctx, b.p, AcquireInput{Key: "k", TTLSeconds: 1})
		require.NoError(t, err)
		b.elapse(t, time.Second)
		second, err := b.adm.Acquire(ctx, b.p, AcquireInput{Key: "k", TTLSeconds: 60})
		require.NoError(t, err)
		require.True(t, second.Admitted)
		require.EqualValues(t, 2, second.FencingToken)
		require.NotNil(t, second.PreviousOperation)
		require.Equal(t, first.OperationID, second.PreviousOperation.ID)
		require.Equal(t, StateUncertain, second.PreviousOperation.State)

		d, err := b.reads.GetOperation(ctx, b.p.TenantID, first.OperationID)
		require.NoError(t, err)
		require.Equal(t, StateUncertain, d.State)
		require.Equal(t, ReasonTTLExpired, *d.StateReason)
		require.False(t, d.Held)
		require.Len(t, d.Events, 1)

		// The late release by the first attempt changes nothing.
		_, err = b.adm.Release(ctx, b.p, ReleaseInput{Key: "k", OwnerToken: first.OwnerToken})
		require.ErrorIs(t, err, ErrNotOwner)
		k, err := b.reads.GetKey(ctx, b.p.TenantID, "k")
		require.NoError(t, err)
		require.True(t, k.Held)
		require.Equal(t, second.OperationID, k.Operation.ID)
		_ = errors.New
	})
}

// ---- shared helpers for the services tests ----

var bg = context.Background()

// mustAcquire acquires key with ttl seconds in b's tenant and requires admission.
func mustAcquire(t *testing.T, b *testBundle, key string, ttl int64) *Acquisition {
	t.Helper()
	acq, err := b.adm.Acquire(bg, b.p, AcquireInput{Key: key, TTLSeconds: ttl})
	require.NoError(t, err)
	require.True(t, acq.Admitted, "acquire %q was not admitted", key)
	return acq
}

// record records in on acq's operation, with acq's owner token unless in names another.
func record(b *testBundle, acq *Acquisition, in OutcomeInput) (*Operation, error) {
	if in.OwnerToken == "" {
		in.OwnerToken = acq.OwnerToken
	}
	return b.adm.RecordOutcome(bg, b.p, acq.OperationID, in)
}

// mustRecord is record that must succeed.
func mustRecord(t *testing.T, b *testBundle, acq *Acquisition, in OutcomeInput) *Operation {
	t.Helper()
	op, err := record(b, acq, in)
	require.NoError(t, err)
	return op
}

// release releases acq's key with acq's owner token.
func release(b *testBundle, acq *Acquisition) (*Operation, error) {
	return b.adm.Release(bg, b.p, ReleaseInput{Key: acq.Key, OwnerToken: acq.OwnerToken})
}

// opState is everything stored about one operation and its key that a refused call must leave
// unchanged, read straight from the database.
type opState struct {
	Op       models.Operation
	Key      models.IdemKey
	Events   []models.Event
	Attempts int64
}

func snapshot(t *testing.T, b *testBundle, opID string) opState {
	t.Helper()
	var s opState
	require.NoError(t, b.db.Where("id = ?", opID).Take(&s.Op).Error)
	require.NoError(t, addCounters(b.db.DB, &s.Op))
	require.NoError(t, b.db.Where("tenant_id = ? AND key = ?", s.Op.TenantID, s.Op.Key).Take(&s.Key).Error)
	require.NoError(t, b.db.Where("operation_id = ?", opID).Order("id").Find(&s.Events).Error)
	require.NoError(t, b.db.Model(&models.Attempt{}).Where("tenant_id = ?", s.Op.TenantID).Count(&s.Attempts).Error)
	return s
}

// opRow reads one operation row straight from the database, with its counter rows added.
func opRow(t *testing.T, b *testBundle, opID string) models.Operation {
	t.Helper()
	var m models.Operation
	require.NoError(t, b.db.Where("id = ?", opID).Take(&m).Error)
	require.NoError(t, addCounters(b.db.DB, &m))
	return m
}

// keyRow reads one key row of b's tenant straight from the database.
func keyRow(t *testing.T, b *testBundle, key string) models.IdemKey {
	t.Helper()
	var k models.IdemKey
	require.NoError(t, b.db.Where("tenant_id = ? AND key = ?", b.p.TenantID, key).Take(&k).Error)
	return k
}

// rowCounts counts b's tenant's rows in every table that acquire, release and outcome write.
type rowCounts struct{ Keys, Operations, Attempts, Events int64 }

func countRows(t *testing.T, b *testBundle) rowCounts {
	t.Helper()
	var c rowCounts
	for _, x := range []struct {
		model any
		n     *int64
	}{{&models.IdemKey{}, &c.Keys}, {&models.Operation{}, &c.Operations}, {&models.Attempt{}, &c.Attempts}, {&models.Event{}, &c.Events}} {
		require.NoError(t, b.db.Model(x.model).Where("tenant_id = ?", b.p.TenantID).Count(x.n).Error)
	}
	return c
}

// otherTenant returns a principal of a new tenant in b's database.
func otherTenant(t *testing.T, b *testBundle) Principal {
	return Principal{TenantID: modeltest.Tenant(t, b.db), Prefix: "idg_othertest"}
}

func TestAttemptIDRetryReadmitsSameOperation(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		in := AcquireInput{Key: "pay-1", TTLSeconds: 60, Operation: ptr("charge"), Fingerprint: ptr("fp"), AttemptID: ptr("a1")}
		first, err := b.adm.Acquire(bg, b.p, in)
		require.NoError(t, err)
		require.True(t, first.Admitted)
		require.False(t, first.Readmitted)

		again, err := b.adm.Acquire(bg, b.p, in)
		require.NoError(t, err)
		require.True(t, again.Admitted)
		require.True(t, again.Readmitted)
		require.Equal(t, first.OperationID, again.OperationID)
		require.Equal(t, first.FencingToken, again.FencingToken)
		require.EqualValues(t, 1, again.FencingToken)
		require.Equal(t, StateInProgress, again.State)
		require.Equal(t, first.ExpiresAt, again.ExpiresAt)
		require.NotEmpty(t, again.OwnerToken)
		require.NotEqual(t, first.OwnerToken, again.OwnerToken)

		// Only the newest owner token works; the replaced one is refused and changes nothing.
		before := snapshot(t, b, first.OperationID)
		_, err = b.adm.Release(bg, b.p, ReleaseInput{Key: "pay-1", OwnerToken: first.OwnerToken})
		require.ErrorIs(t, err, ErrNotOwner)
		_, err = record(b, first, OutcomeInput{Status: StateSucceeded})
		require.ErrorIs(t, err, ErrNotOwner)
		require.Equal(t, before, snapshot(t, b, first.OperationID))

		// A different attempt_id is an ordinary duplicate.
		other := in
		other.AttemptID = ptr("a2")
		dup, err := b.adm.Acquire(bg, b.p, other)
		require.NoError(t, err)
		require.False(t, dup.Admitted)
		require.Empty(t, dup.OwnerToken)
		require.Equal(t, first.OperationID, dup.Operation.ID)
		// An attempt_id retry with a different fingerprint is still a conflict.
		other.AttemptID, other.Fingerprint = ptr("a1"), ptr("fp2")
		_, err = b.adm.Acquire(bg, b.p, other)
		require.ErrorIs(t, err, ErrFingerprintMismatch)

		page, err := b.reads.ListAttempts(bg, b.p.TenantID, AttemptFilter{Key: "pay-1"})
		require.NoError(t, err)
		var got []string
		for _, a := range page.Items {
			got = append(got, a.Result+":"+deref(a.AttemptID))
			require.Equal(t, first.OperationID, deref(a.OperationID))
		}
		require.Equal(t, []string{"conflict:a1", "duplicate:a2", "admitted:a1", "admitted:a1"}, got)

		op, err := release(b, again)
		require.NoError(t, err)
		require.Equal(t, StateReleased, op.State)
		require.EqualValues(t, 1, op.DuplicateAttempts)
		require.EqualValues(t, 1, op.ConflictAttempts)
	})
}

func TestPreviousOperation(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		succ := mustAcquire(t, b, "prev-succeeded", 1)
		mustRecord(t, b, succ, OutcomeInput{Status: StateSucceeded, Receipt: ptr("rcpt-1")})
		rel := mustAcquire(t, b, "prev-released", 1)
		_, err := release(b, rel)
		require.NoError(t, err)
		failed := mustAcquire(t, b, "prev-failed", 1)
		mustRecord(t, b, failed, OutcomeInput{Status: StateFailed})
		b.elapse(t, time.Second)

		next := mustAcquire(t, b, "prev-succeeded", 60)
		require.EqualValues(t, 2, next.FencingToken)
		require.Equal(t, &PreviousOperation{ID: succ.OperationID, State: StateSucceeded, FencingToken: 1,
			OutcomeStatus: ptr(StateSucceeded), OutcomeReceipt: ptr("rcpt-1")}, next.PreviousOperation)
		// The succeeded operation keeps its state; only the hold moved on.
		require.Equal(t, StateSucceeded, opRow(t, b, succ.OperationID).State)

		next = mustAcquire(t, b, "prev-released", 60)
		require.EqualValues(t, 2, next.FencingToken)
		require.Nil(t, next.PreviousOperation)

		next = mustAcquire(t, b, "prev-failed", 60)
		require.EqualValues(t, 2, next.FencingToken)
		require.Nil(t, next.PreviousOperation)
		require.Equal(t, StateFailed, opRow(t, b, failed.OperationID).State)
	})
}

// Many goroutines acquire, release and record outcomes on a few keys while a reaper runs; the
// stored evidence must keep its invariants whatever the interleaving.
func TestConcurrentMixKeepsInvariants(t *testing.T) {
	eachDB(t, func(t *testing.T, b *testBundle) {
		const workers = 40
		keys := []string{"mix-a", "mix-b", "mix-c", "mix-d", "mix-e"}
		var (
			mu         sync.Mutex
			admissions []*Acquisition
			unexpected []error
			admitted   int
			dups       int
		)
		// Refusals are part of the game; anything else (a deadlock, a 5xx) is a failure.
		check := func(what string, err error) {
			for _, ok := range []error{ErrNotOwner, ErrKeyNotHeld, ErrEffectConfirmed, ErrOutcomeUncertain,
				ErrInvalidTransition, ErrFingerprintMismatch} {
				if err == nil || errors.Is(err, ok) {
					return
				}
			}
			mu.Lock()
			unexpected = append(unexpected, fmt.Errorf("%s: %w", what, err))
			mu.Unlock()
		}
		stop := time.Now().Add(1500 * time.Millisecond)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				_, err := b.reaper.RunOnce(bg)
				check("reap", err)
				time.Sleep(20 * time.Millisecond)
			}
		}()
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(w), 42))
				for time.Now().Before(stop) {
					key := keys[rng.IntN(len(keys))]
					in := AcquireInput{Key: key, TTLSeconds: 1}
					if rng.IntN(10) == 0 {
						in.TTLSeconds = 3
					}
					if rng.IntN(8) == 0 {
						in.Fingerprint = ptr("other")
					}
					acq, err := b.adm.Acquire(bg, b.p, in)
					check("acquire", err)
					mu.Lock()
					if err == nil && acq.Admitted {
						admitted++
						admissions = append(admissions, acq)
					} else if err == nil {
						dups++
					}
					var target *Acquisition
					if err == nil && acq.Admitted && rng.IntN(3) > 0 {
						target = acq
					} else if len(admissions) > 0 {
						target = admissions[rng.IntN(len(admissions))] // often a stale owner
					}
					mu.Unlock()
					if target == nil {
						continue
					}
					switch rng.IntN(7) {
					case 0, 1:
						_, err = release(b, target)
					case 2:
						_, err = record(b, target, OutcomeInput{Status: StateSucceeded, Receipt: ptr("r")})
					case 3:
						_, err = record(b, target, OutcomeInput{Status: StateFailed})
					case 4:
						_, err = record(b, target, OutcomeInput{Status: StateFailed, Release: true})
					case 5:
						_, err = record(b, target, OutcomeInput{Status: StateUncertain})
					case 6:
						_, err = b.adm.Release(bg, b.p, ReleaseInput{Key: key, OwnerToken: target.OwnerToken})
					}
					check("act", err)
				}
			}(w)
		}
		wg.Wait()
		require.Empty(t, unexpected)
		require.Greater(t, admitted, len(keys), "the mix should have re-admitted keys")
		require.Positive(t, dups)
		t.Logf("%d admitted, %d duplicates", admitted, dups)
		checkInvariants(t, b, admitted)
	})
}

// checkInvariants reads b's tenant's evidence straight from the database and checks it.
func checkInvariants(t *testing.T, b *testBundle, admitted int) {
	t.Helper()
	tid := b.p.TenantID
	var ops []models.Operation
	require.NoError(t, b.db.Where("tenant_id = ?", tid).Order("key, fencing_token").Find(&ops).Error)
	require.Len(t, ops, admitted, "one operation per admission")
	byID := map[string]models.Operation{}
	byKey := map[string][]models.Operation{}
	for _, op := range ops {
		byID[op.ID] = op
		byKey[op.Key] = append(byKey[op.Key], op)
	}
	// Fencing tokens per key are 1..n without gaps or repeats.
	for key, gen := range byKey {
		for i, op := range gen {
			require.EqualValues(t, i+1, op.FencingToken, "key %s", key)
		}
	}
	var ks []models.IdemKey
	require.NoError(t, b.db.Where("tenant_id = ?", tid).Find(&ks).Error)
	require.Len(t, ks, len(byKey))
	for _, k := range ks {
		gen := byKey[k.Key]
		require.NotEmpty(t, gen, k.Key)
		last := gen[len(gen)-1]
		require.EqualValues(t, len(gen), k.FencingToken, k.Key)
		require.Equal(t, last.ID, k.LastOperationID, k.Key)
		// At most one hold per key, and only ever by the newest operation, never a released one.
		if k.HolderOperationID != nil {
			require.Equal(t, last.ID, *k.HolderOperationID, k.Key)
			require.NotEqual(t, StateReleased, last.State, k.Key)
			require.NotNil(t, k.ExpiresAt, k.Key)
		} else {
			require.Nil(t, k.ExpiresAt, k.Key)
		}
		// Every older generation was taken over, so none of them may still be in_progress.
		for _, op := range gen[:len(gen)-1] {
			require.NotEqual(t, StateInProgress, op.State, "%s generation %d", k.Key, op.FencingToken)
		}
	}
	for _, op := range ops {
		if op.State == StateReleased {
			require.NotNil(t, op.ReleasedAt)
		}
		if op.State != StateInProgress && op.State != StateUncertain {
			require.NotNil(t, op.EndedAt, "%s is %s", op.ID, op.State)
		}
	}
	// Every attempt has its operation; every admission has exactly one admitted attempt.
	var atts []models.Attempt
	require.NoError(t, b.db.Where("tenant_id = ?", tid).Find(&atts).Error)
	admittedAttempts := map[string]int{}
	for _, a := range atts {
		require.NotNil(t, a.OperationID)
		op, ok := byID[*a.OperationID]
		require.True(t, ok, "attempt %d names a missing operation", a.ID)
		require.Equal(t, op.Key, a.Key)
		if a.Result == ResultAdmitted {
			admittedAttempts[op.ID]++
		}
	}
	require.Len(t, admittedAttempts, len(ops))
	for id, n := range admittedAttempts {
		require.Equal(t, 1, n, id)
	}
	// The system marks an operation uncertain at most once (acquire and reaper never both do).
	var marks []struct {
		OperationID string
		N           int64
	}
	require.NoError(t, b.db.Model(&models.Event{}).Select("operation_id, count(*) AS n").
		Where("tenant_id = ? AND kind = ?", tid, EventStateChanged).Group("operation_id").Scan(&marks).Error)
	for _, m := range marks {
		require.EqualValues(t, 1, m.N, m.OperationID)
	}
}

// Of 32 concurrent acquires of an expired key, exactly one is admitted, with fencing token 2.
func TestConcurrentAcquireOfExpiredKey(t *testing.T) {
	eachDB(t, func(t *testing.T, b *testBundle) {
		old := mustAcquire(t, b, "expired-race", 1)
		b.elapse(t, time.Second)
		const n = 32
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			winners []*Acquisition
			dups    []*Acquisition
			errs    []error
		)
		start := make(chan struct{})
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				acq, err := b.adm.Acquire(bg, b.p, AcquireInput{Key: "expired-race", TTLSeconds: 60})
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err != nil:
					errs = append(errs, err)
				case acq.Admitted:
					winners = append(winners, acq)
				default:
					dups = append(dups, acq)
				}
			}()
		}
		close(start)
		wg.Wait()
		require.Empty(t, errs)
		require.Len(t, winners, 1)
		require.Len(t, dups, n-1)
		w := winners[0]
		require.EqualValues(t, 2, w.FencingToken)
		require.Equal(t, &PreviousOperation{ID: old.OperationID, State: StateUncertain, FencingToken: 1}, w.PreviousOperation)
		for _, d := range dups {
			require.Equal(t, w.OperationID, d.Operation.ID)
			require.EqualValues(t, 2, d.Operation.FencingToken)
		}
		d, err := b.reads.GetOperation(bg, b.p.TenantID, old.OperationID)
		require.NoError(t, err)
		require.Equal(t, StateUncertain, d.State)
		require.Len(t, d.Events, 1)
		k, err := b.reads.GetKey(bg, b.p.TenantID, "expired-race")
		require.NoError(t, err)
		require.Equal(t, w.OperationID, k.Operation.ID)
		require.EqualValues(t, n-1, k.Operation.DuplicateAttempts)
		checkInvariants(t, b, 2)
	})
}

// Keyset pagination newest first, filters, and refusal of bad parameters (docs/reference.md §4 "Reads").
func TestListKeysAndAttempts(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		var want []string // newest first
		for i := 0; i < 7; i++ {
			key := fmt.Sprintf("list-%d", i)
			in := AcquireInput{Key: key, TTLSeconds: 60}
			if i%2 == 0 {
				in.Operation = ptr("even")
			}
			acq, err := b.adm.Acquire(bg, b.p, in)
			require.NoError(t, err)
			if i == 3 {
				mustRecord(t, b, acq, OutcomeInput{Status: StateSucceeded})
			}
			want = append([]string{key}, want...)
		}
		var got []string
		cursor := ""
		for pages := 0; ; pages++ {
			require.Less(t, pages, 10)
			page, err := b.reads.ListKeys(bg, b.p.TenantID, KeyFilter{Limit: 3, Cursor: cursor})
			require.NoError(t, err)
			require.LessOrEqual(t, len(page.Items), 3)
			for _, it := range page.Items {
				got = append(got, it.Key)
			}
			if page.NextCursor == "" {
				break
			}
			cursor = page.NextCursor
		}
		require.Equal(t, want, got)

		page, err := b.reads.ListKeys(bg, b.p.TenantID, KeyFilter{State: StateSucceeded})
		require.NoError(t, err)
		require.Len(t, page.Items, 1)
		require.Equal(t, "list-3", page.Items[0].Key)
		page, err = b.reads.ListKeys(bg, b.p.TenantID, KeyFilter{Operation: "even"})
		require.NoError(t, err)
		require.Len(t, page.Items, 4)
		page, err = b.reads.ListKeys(bg, b.p.TenantID, KeyFilter{Operation: "even", State: StateInProgress, Limit: 2})
		require.NoError(t, err)
		require.Equal(t, []string{"list-6", "list-4"}, []string{page.Items[0].Key, page.Items[1].Key})
		require.NotEmpty(t, page.NextCursor)

		for name, f := range map[string]KeyFilter{
			"limit too big": {Limit: MaxListLimit + 1}, "negative limit": {Limit: -1}, "bad state": {State: "done"},
			"bad operation": {Operation: "a b"}, "bad cursor": {Cursor: "!!"}, "forged cursor": {Cursor: "bm9wZQ"},
		} {
			_, err := b.reads.ListKeys(bg, b.p.TenantID, f)
			require.ErrorIs(t, err, ErrInvalidRequest, name)
		}

		// Attempts: one duplicate and one conflict on list-0, then page through everything.
		_, err = b.adm.Acquire(bg, b.p, AcquireInput{Key: "list-0", TTLSeconds: 60, Operation: ptr("even")})
		require.NoError(t, err)
		_, err = b.adm.Acquire(bg, b.p, AcquireInput{Key: "list-0", TTLSeconds: 60})
		require.ErrorIs(t, err, ErrFingerprintMismatch)
		atts, err := b.reads.ListAttempts(bg, b.p.TenantID, AttemptFilter{Key: "list-0"})
		require.NoError(t, err)
		require.Len(t, atts.Items, 3)
		require.Equal(t, ResultConflict, atts.Items[0].Result)
		require.Equal(t, b.p.Prefix, atts.Items[0].Caller)
		atts, err = b.reads.ListAttempts(bg, b.p.TenantID, AttemptFilter{Result: ResultDuplicate})
		require.NoError(t, err)
		require.Len(t, atts.Items, 1)
		var ids []int64
		cursor = ""
		for pages := 0; ; pages++ {
			require.Less(t, pages, 10)
			p, err := b.reads.ListAttempts(bg, b.p.TenantID, AttemptFilter{Limit: 4, Cursor: cursor})
			require.NoError(t, err)
			for _, a := range p.Items {
				ids = append(ids, a.ID)
			}
			if p.NextCursor == "" {
				break
			}
			cursor = p.NextCursor
		}
		require.Len(t, ids, 9)
		for i := 1; i < len(ids); i++ {
			require.Greater(t, ids[i-1], ids[i], "newest first, no repeats")
		}
		future := time.Now().Add(time.Hour)
		atts, err = b.reads.ListAttempts(bg, b.p.TenantID, AttemptFilter{Since: &future})
		require.NoError(t, err)
		require.Empty(t, atts.Items)
		past := time.Now().Add(-time.Hour)
		atts, err = b.reads.ListAttempts(bg, b.p.TenantID, AttemptFilter{Since: &past, Limit: MaxListLimit})
		require.NoError(t, err)
		require.Len(t, atts.Items, 9)
		for name, f := range map[string]AttemptFilter{
			"limit too big": {Limit: MaxListLimit + 1}, "bad result": {Result: "ok"}, "bad key": {Key: "a\x00"},
			"bad cursor": {Cursor: "x"}, "zero cursor": {Cursor: "0"},
		} {
			_, err := b.reads.ListAttempts(bg, b.p.TenantID, f)
			require.ErrorIs(t, err, ErrInvalidRequest, name)
		}
	})
}

// TestOperationIDsAreTimeOrdered: operations get UUIDv7 ids (newOperationID), later ones
// sorting after earlier ones, single and batch acquires alike, so the indexes on operation ids
// fill at their right edge.
func TestOperationIDsAreTimeOrdered(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		var ids []string
		for i := 0; i < 3; i++ {
			acq, err := b.adm.Acquire(bg, b.p, AcquireInput{Key: fmt.Sprintf("v7-%d", i), TTLSeconds: 60})
			require.NoError(t, err)
			ids = append(ids, acq.OperationID)
		}
		items, err := b.adm.AcquireBatch(bg, b.p, []AcquireInput{{Key: "v7-b0", TTLSeconds: 60}, {Key: "v7-b1", TTLSeconds: 60}})
		require.NoError(t, err)
		for _, it := range items {
			require.NoError(t, it.Err)
			ids = append(ids, it.Acquisition.OperationID)
		}
		for i, id := range ids {
			u, err := uuid.Parse(id)
			require.NoError(t, err)
			require.EqualValues(t, 7, u.Version(), "operation %d: %s", i, id)
			if i > 0 {
				require.Less(t, ids[i-1], id, "operation %d sorts after operation %d", i, i-1)
			}
		}
	})
}
