package services

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/idemgate/idemgate/models"
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
