package services

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/models/modeltest"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

// TestLifecycleHorizonAndTombstones walks one key through docs/reference.md §2 "Lifecycle" on
// both databases, alone and in a batch: a success with a horizon answers duplicates past its
// TTL with its evidence; the purge at its retention leaves a tombstone that still answers the
// same request as a duplicate of the purged operation and refuses another; after the horizon
// the key is admitted again with a greater fencing token. The values in force at admission
// stay the operation's: a later policy change does not shorten them.
func TestLifecycleHorizonAndTombstones(t *testing.T) {
	retention, horizon := 10*time.Second, time.Minute
	eachDB(t, func(t *testing.T, b *testBundle) {
		ps := NewPolicies(b.db, nil)
		adm := b.adm.WithPolicies(ps)
		tenant := b.tenantName(t)
		_, err := ps.Set(bg, Installation(), PolicyInput{Tenant: tenant, Operation: "charge", Retention: &retention, Horizon: &horizon})
		require.NoError(t, err)

		req := AcquireInput{Key: "pay-1", TTLSeconds: 5, Operation: ptr("charge"), Fingerprint: ptr("fp")}
		first, err := adm.Acquire(bg, b.p, req)
		require.NoError(t, err)
		require.True(t, first.Admitted)
		require.Equal(t, int64(10), deref(first.RetentionSeconds))
		require.Equal(t, int64(60), deref(first.HorizonSeconds))
		one := time.Second
		_, err = ps.Set(bg, Installation(), PolicyInput{Tenant: tenant, Operation: "charge", Retention: &one, Horizon: &one})
		require.NoError(t, err, "a later, shorter policy")
		_, err = adm.RecordOutcome(bg, b.p, first.OperationID, OutcomeInput{OwnerToken: first.OwnerToken,
			Status: StateSucceeded, Receipt: ptr("ch_1"), Response: json.RawMessage(`{"id":1}`)})
		require.NoError(t, err)
		ended := opRow(t, b, first.OperationID)
		require.NotNil(t, ended.PurgeAfter)
		require.Equal(t, ended.EndedAt.Add(retention), *ended.PurgeAfter, "retention as admitted, not as changed")

		both := func(in AcquireInput) [2]*Acquisition {
			var out [2]*Acquisition
			var errs [2]error
			out[0], errs[0] = adm.Acquire(bg, b.p, in)
			items, err := adm.AcquireBatch(bg, b.p, []AcquireInput{in})
			require.NoError(t, err)
			out[1], errs[1] = items[0].Acquisition, items[0].Err
			for _, e := range errs {
				if e != nil {
					require.ErrorIs(t, e, ErrFingerprintMismatch)
				}
			}
			require.Equal(t, errs[0] == nil, errs[1] == nil, "acquire and batch agree")
			return out
		}

		// Past the TTL, within the retention: the operation itself answers.
		b.elapse(t, 6*time.Second, "pay-1")
		_, err = b.reaper.RunOnce(bg)
		require.NoError(t, err)
		for _, acq := range both(req) {
			require.False(t, acq.Admitted)
			require.Equal(t, first.OperationID, acq.Operation.ID)
			require.False(t, acq.Operation.EvidencePurged)
			require.JSONEq(t, `{"id":1}`, string(acq.Operation.Outcome.Response))
			require.NotNil(t, acq.Operation.ProtectedUntil)
			require.Equal(t, int64(60), deref(acq.Operation.HorizonSeconds))
		}
		other := req
		other.Fingerprint = ptr("other")
		require.Equal(t, [2]*Acquisition{}, both(other), "another request is a conflict")

		// Past the retention: purged, and the tombstone answers.
		b.elapse(t, 5*time.Second, "pay-1")
		res, err := b.reaper.RunOnce(bg)
		require.NoError(t, err)
		require.GreaterOrEqual(t, res.OperationsPurged, int64(1))
		require.GreaterOrEqual(t, res.TombstonesWritten, int64(1))
		require.ErrorIs(t, b.db.Where("id = ?", first.OperationID).Take(&models.Operation{}).Error, gorm.ErrRecordNotFound)
		for _, acq := range both(req) {
			require.False(t, acq.Admitted)
			op := acq.Operation
			require.True(t, op.EvidencePurged)
			require.Equal(t, first.OperationID, op.ID)
			require.Equal(t, "pay-1", op.Key)
			require.Equal(t, StateSucceeded, op.State)
			require.Equal(t, int64(1), op.FencingToken)
			require.Equal(t, "ch_1", deref(op.Outcome.Receipt))
			require.Nil(t, op.Outcome.Response, "the stored response went with the evidence")
			require.NotNil(t, op.ProtectedUntil)
			require.False(t, op.Held)
		}
		require.Equal(t, [2]*Acquisition{}, both(other), "the tombstone refuses another request")
		kv, err := b.reads.GetKey(bg, b.p.TenantID, "pay-1")
		require.NoError(t, err)
		require.NotNil(t, kv.Operation, "GET /v1/keys names the tombstone")
		require.True(t, kv.Operation.EvidencePurged)
		require.Equal(t, first.OperationID, kv.Operation.ID)
		require.False(t, kv.Held)
		page, err := b.reads.ListKeys(bg, b.p.TenantID, KeyFilter{KeyPrefix: "pay-", Limit: 10})
		require.NoError(t, err)
		require.Len(t, page.Items, 1)
		require.True(t, page.Items[0].Operation.EvidencePurged, "the keys list shows the tombstoned key")
		var logged models.Attempt
		require.NoError(t, b.db.Where("tenant_id = ? AND key = ?", b.p.TenantID, "pay-1").Order("id DESC").Take(&logged).Error)
		require.Equal(t, ResultConflict, logged.Result)
		require.Equal(t, first.OperationID, deref(logged.OperationID), "the attempt names the purged operation")

		// Past the horizon: free, with a greater fencing token and no warning about evidence
		// that is gone.
		b.elapse(t, horizon, "pay-1")
		again, err := adm.Acquire(bg, b.p, req)
		require.NoError(t, err)
		require.True(t, again.Admitted)
		require.Equal(t, int64(2), again.FencingToken)
		require.Nil(t, again.PreviousOperation)
		var k models.IdemKey
		require.NoError(t, b.db.Where("tenant_id = ? AND key = ?", b.p.TenantID, "pay-1").Take(&k).Error)
		require.Nil(t, k.ProtectedUntil, "the takeover cleared the tombstone")
		require.Nil(t, k.TombState)
		require.Equal(t, int64(1), deref(again.RetentionSeconds), "admitted under the policy as it is now")
	})
}

// TestHorizonKeepsOnlySuccesses: a failed or released operation never keeps its key past the
// TTL, whatever its horizon (nothing happened, or its owner gave the key back), and an
// operation without a policy has no horizon and the installation's retention.
func TestHorizonKeepsOnlySuccesses(t *testing.T) {
	retention, horizon := time.Hour, 24*time.Hour
	eachDB(t, func(t *testing.T, b *testBundle) {
		ps := NewPolicies(b.db, nil)
		adm := b.adm.WithPolicies(ps)
		_, err := ps.Set(bg, Installation(), PolicyInput{Tenant: b.tenantName(t), Operation: "charge", Retention: &retention, Horizon: &horizon})
		require.NoError(t, err)
		for _, c := range []struct {
			name   string
			end    func(acq *Acquisition)
			admits bool
		}{
			{"failed", func(acq *Acquisition) {
				_, err := adm.RecordOutcome(bg, b.p, acq.OperationID, OutcomeInput{OwnerToken: acq.OwnerToken, Status: StateFailed})
				require.NoError(t, err)
			}, true},
			{"released", func(acq *Acquisition) {
				_, err := adm.Release(bg, b.p, ReleaseInput{Key: acq.Key, OwnerToken: acq.OwnerToken})
				require.NoError(t, err)
			}, true},
			{"succeeded", func(acq *Acquisition) {
				_, err := adm.RecordOutcome(bg, b.p, acq.OperationID, OutcomeInput{OwnerToken: acq.OwnerToken, Status: StateSucceeded})
				require.NoError(t, err)
			}, false},
		} {
			t.Run(c.name, func(t *testing.T) {
				in := AcquireInput{Key: "h-" + c.name, TTLSeconds: 5, Operation: ptr("charge")}
				acq, err := adm.Acquire(bg, b.p, in)
				require.NoError(t, err)
				c.end(acq)
				b.elapse(t, 6*time.Second, in.Key)
				next, err := adm.Acquire(bg, b.p, in)
				require.NoError(t, err)
				require.Equal(t, c.admits, next.Admitted)
			})
		}
		plain, err := adm.Acquire(bg, b.p, AcquireInput{Key: "no-policy", TTLSeconds: 5})
		require.NoError(t, err)
		require.Nil(t, plain.RetentionSeconds)
		require.Nil(t, plain.HorizonSeconds)
	})
}

// TestRequestHashAgrees: Go's requestHash, which SQLite's tombstones keep, equals PostgreSQL's
// idemgate_request_hash, which PostgreSQL's acquire compares them with; absent and present
// names and fingerprints, and non-ASCII, all hash apart.
func TestRequestHashAgrees(t *testing.T) {
	onPostgres(t, func(t *testing.T, b *testBundle) {
		seen := map[int64]bool{}
		for _, c := range []struct{ name, fp *string }{
			{nil, nil}, {ptr("charge"), nil}, {nil, ptr("charge")}, {ptr("charge"), ptr("fp")},
			{ptr("charge"), ptr("fp ü 日本")}, {ptr("a"), ptr("b\nc")}, {ptr("refund"), ptr("fp")},
		} {
			var sql int64
			require.NoError(t, b.db.Raw("SELECT idemgate_request_hash(?, ?)", c.name, c.fp).Row().Scan(&sql))
			require.Equal(t, requestHash(c.name, c.fp), sql, "%v %v", deref(c.name), deref(c.fp))
			require.False(t, seen[sql])
			seen[sql] = true
		}
	})
}

// TestLateSuccessProtectsItsKey: an operation that succeeds after its key was taken over from
// it (its owner's late outcome, or a reconciliation of the uncertain operation) has had its
// effect, so its key refuses a new admission until its horizon ends, whatever the newer
// operation does: answered about it while its evidence is kept, then by its tombstone (with its
// own fencing token). Found by issue 30's review: a released newer operation let the key be
// admitted a third time, with no warning, within the late success's horizon.
func TestLateSuccessProtectsItsKey(t *testing.T) {
	retention, horizon := 10*time.Second, time.Hour
	eachDB(t, func(t *testing.T, b *testBundle) {
		ps := NewPolicies(b.db, nil)
		adm := b.adm.WithPolicies(ps)
		_, err := ps.Set(bg, Installation(), PolicyInput{Tenant: b.tenantName(t), Operation: "charge", Retention: &retention,
			Horizon: &horizon})
		require.NoError(t, err)
		for i, late := range []string{"owner", "operator"} {
			t.Run(late, func(t *testing.T) {
				key := fmt.Sprintf("late-%d", i)
				req := AcquireInput{Key: key, TTLSeconds: 5, Operation: ptr("charge"), Fingerprint: ptr("fp")}
				o1, err := adm.Acquire(bg, b.p, req)
				require.NoError(t, err)
				b.elapse(t, 6*time.Second, key)
				_, err = b.reaper.RunOnce(bg)
				require.NoError(t, err)
				o2, err := adm.Acquire(bg, b.p, req)
				require.NoError(t, err)
				require.True(t, o2.Admitted, "o1 is uncertain and readmit: admitted with a warning")
				require.Equal(t, o1.OperationID, o2.PreviousOperation.ID)

				if late == "owner" {
					_, err = adm.RecordOutcome(bg, b.p, o1.OperationID, OutcomeInput{OwnerToken: o1.OwnerToken,
						Status: StateSucceeded, Receipt: ptr("ch_late")})
				} else {
					_, err = b.recon.ReconcileOutcome(bg, Installation(), o1.OperationID, ReconcileInput{Status: StateSucceeded,
						Receipt: ptr("ch_late"), Note: "found at the PSP"})
				}
				require.NoError(t, err)
				_, err = adm.RecordOutcome(bg, b.p, o2.OperationID, OutcomeInput{OwnerToken: o2.OwnerToken,
					Status: StateFailed, Release: true})
				require.NoError(t, err)

				check := func(purged bool) {
					t.Helper()
					third, err := adm.Acquire(bg, b.p, req)
					require.NoError(t, err)
					items, err := adm.AcquireBatch(bg, b.p, []AcquireInput{req})
					require.NoError(t, err)
					require.NoError(t, items[0].Err)
					for _, acq := range []*Acquisition{third, items[0].Acquisition} {
						require.False(t, acq.Admitted, "o1 succeeded within its horizon: never admitted again")
						require.Equal(t, o1.OperationID, acq.Operation.ID)
						require.Equal(t, StateSucceeded, acq.Operation.State)
						require.Equal(t, int64(1), acq.Operation.FencingToken)
						require.Equal(t, "ch_late", deref(acq.Operation.Outcome.Receipt))
						require.Equal(t, purged, acq.Operation.EvidencePurged)
					}
				}
				check(false)
				b.elapse(t, 11*time.Second, key)
				res, err := b.reaper.RunOnce(bg)
				require.NoError(t, err)
				require.GreaterOrEqual(t, res.TombstonesWritten, int64(1))
				check(true)

				b.elapse(t, horizon, key)
				again, err := adm.Acquire(bg, b.p, req)
				require.NoError(t, err)
				require.True(t, again.Admitted)
				require.Equal(t, int64(3), again.FencingToken)
			})
		}
	})
}

// TestProtectingSuccessRacesTakeover: on PostgreSQL, a success that protects its key (it takes
// the key row) racing an acquire that takes the expired key over (key row, then operation)
// never deadlocks: both lock the key row first. Issue 30's review saw 2 of 770 such outcomes
// answered 503 (deadlock detected) when the outcome took the operation first.
func TestProtectingSuccessRacesTakeover(t *testing.T) {
	horizon := time.Hour
	onPostgres(t, func(t *testing.T, b *testBundle) {
		ps := NewPolicies(b.db, nil)
		adm := b.adm.WithPolicies(ps)
		_, err := ps.Set(bg, Installation(), PolicyInput{Tenant: b.tenantName(t), Operation: "charge", Horizon: &horizon})
		require.NoError(t, err)
		const workers, rounds = 8, 25
		var wg sync.WaitGroup
		errs := make(chan error, workers*rounds*2)
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for r := range rounds {
					key := fmt.Sprintf("race-%d-%d", w, r)
					req := AcquireInput{Key: key, TTLSeconds: 60, Operation: ptr("charge")}
					first, err := adm.Acquire(bg, b.p, req)
					if err != nil {
						errs <- err
						return
					}
					modeltest.Elapse(t, b.db, b.p.TenantID, 61*time.Second, key)
					var race sync.WaitGroup
					race.Add(2)
					go func() {
						defer race.Done()
						_, err := adm.RecordOutcome(bg, b.p, first.OperationID, OutcomeInput{OwnerToken: first.OwnerToken,
							Status: StateSucceeded})
						if err != nil && !errors.Is(err, ErrInvalidTransition) && !isCode(err, CodeInvalidTransition) {
							errs <- fmt.Errorf("outcome: %w", err)
						}
					}()
					go func() {
						defer race.Done()
						if _, err := adm.Acquire(bg, b.p, req); err != nil {
							errs <- fmt.Errorf("acquire: %w", err)
						}
					}()
					race.Wait()
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		require.Zero(t, deadlocks.Load(), "statements chosen as a deadlock's victim")
	})
}
