package services

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgate/idemgate/models"
	"github.com/stretchr/testify/require"
)

// quickUncertain admits key and has its owner report the outcome uncertain: it joins the
// queue at once, without waiting for a TTL.
func quickUncertain(t *testing.T, b *testBundle, p Principal, key string) *Acquisition {
	t.Helper()
	acq, err := b.adm.Acquire(bg, p, AcquireInput{Key: key, TTLSeconds: 300})
	require.NoError(t, err)
	_, err = b.adm.RecordOutcome(bg, p, acq.OperationID, OutcomeInput{OwnerToken: acq.OwnerToken, Status: StateUncertain})
	require.NoError(t, err)
	return acq
}

// outcomeEvents counts the events that reconciled operation id (outcome_recorded from
// uncertain; the owner's own "uncertain" report is an outcome event too, from in_progress).
func outcomeEvents(t *testing.T, b *testBundle, id string) int64 {
	t.Helper()
	var n int64
	require.NoError(t, b.db.Model(&models.Event{}).Where("operation_id = ? AND kind = ? AND detail LIKE ?", id, EventOutcome,
		"uncertain -> %").Count(&n).Error)
	return n
}

// TestBulkReconcileSelection: a job by selection reconciles each uncertain operation with its
// own event under the actor, skips the one that is no longer uncertain and the other
// tenant's (as not found), and a repeat of the job id returns the same job and changes nothing.
func TestBulkReconcileSelection(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		a := quickUncertain(t, b, b.p, "bulk/a")
		c := quickUncertain(t, b, b.p, "bulk/c")
		done := quickUncertain(t, b, b.p, "bulk/done")
		_, err := b.recon.ReconcileOutcome(bg, operatorAcct(RoleOperator, &b.p.TenantID), done.OperationID,
			ReconcileInput{Status: StateSucceeded, Note: "by hand"})
		require.NoError(t, err)
		other := quickUncertain(t, b, otherTenant(t, b), "bulk/other")

		in := BulkReconcileInput{JobID: "job-1", Status: StateFailed, Note: "PSP says declined",
			OperationIDs: []string{a.OperationID, done.OperationID, strings.ToUpper(c.OperationID), other.OperationID, a.OperationID}}
		job, err := b.recon.BulkReconcileForAPI(bg, b.p, in)
		require.NoError(t, err)
		require.True(t, job.Created)
		require.Equal(t, JobCompleted, job.Status)
		require.Equal(t, "api:"+b.p.Prefix, job.Actor)
		require.Equal(t, 4, job.Total, "duplicates dropped")
		require.Equal(t, 2, job.Done)
		require.Equal(t, 2, job.Skipped)
		require.Equal(t, []JobItem{
			{OperationID: a.OperationID, Result: ItemDone},
			{OperationID: done.OperationID, Result: ItemSkipped, Detail: "no longer uncertain: now succeeded"},
			{OperationID: c.OperationID, Result: ItemDone},
			{OperationID: other.OperationID, Result: ItemSkipped, Detail: "not found"},
		}, job.Items)
		for _, id := range []string{a.OperationID, c.OperationID} {
			row := opRow(t, b, id)
			require.Equal(t, StateFailed, row.State)
			require.Equal(t, "PSP says declined", deref(row.OutcomeNote))
			require.Equal(t, "api:"+b.p.Prefix, deref(row.OutcomeBy))
			require.EqualValues(t, 1, outcomeEvents(t, b, id))
		}
		require.Equal(t, StateUncertain, opRow(t, b, other.OperationID).State, "another tenant's is untouched")

		// The same job again: the same result, created false, nothing changes twice.
		again, err := b.recon.BulkReconcileForAPI(bg, b.p, in)
		require.NoError(t, err)
		require.False(t, again.Created)
		require.Equal(t, job.ID, again.ID)
		require.Equal(t, job.Items, again.Items)
		require.EqualValues(t, 1, outcomeEvents(t, b, a.OperationID))

		// The job id with another request is refused; another tenant may use the same id.
		in2 := in
		in2.Status = StateSucceeded
		_, err = b.recon.BulkReconcileForAPI(bg, b.p, in2)
		require.True(t, isCode(err, CodeJobIDReused), "%v", err)
		o := otherTenant(t, b)
		j2, err := b.recon.BulkReconcileForAPI(bg, o, BulkReconcileInput{JobID: "job-1", Status: StateFailed, Note: "n",
			OperationIDs: []string{a.OperationID}})
		require.NoError(t, err)
		require.True(t, j2.Created)
		require.Equal(t, []JobItem{{OperationID: a.OperationID, Result: ItemSkipped, Detail: "not found"}}, j2.Items)
	})
}

// TestBulkReconcileFilter: a job by filter takes the queue's operations matching it, oldest
// first, frozen when the job is created; an operator's job is recorded under the username and
// its page is visible to the tenant's accounts only.
func TestBulkReconcileFilter(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		ttl := makeUncertain(t, b, "bulkf/ttl") // ttl_expired_without_outcome
		reported := quickUncertain(t, b, b.p, "bulkf/reported")
		acct := operatorAcct(RoleOperator, &b.p.TenantID)
		job, err := b.recon.BulkReconcileForOperator(bg, acct, BulkReconcileInput{JobID: "f-1", Status: StateSucceeded,
			Note: "ledger shows both", Filter: &BulkFilter{Reason: ReasonTTLExpired}})
		require.NoError(t, err)
		require.Equal(t, SelectionFilter, job.Selection)
		require.Equal(t, []JobItem{{OperationID: ttl.OperationID, Result: ItemDone}}, job.Items)
		require.Equal(t, acct.Username, job.Actor)
		require.Equal(t, ReasonTTLExpired, job.Filter.Reason)
		require.Equal(t, acct.Username, deref(opRow(t, b, ttl.OperationID).OutcomeBy))
		require.Equal(t, StateUncertain, opRow(t, b, reported.OperationID).State)

		// The owner-reported ones (no state_reason) are a reason of the filter too (issue 28).
		mine, err := b.recon.BulkReconcileForOperator(bg, acct, BulkReconcileInput{JobID: "f-3", Status: StateFailed,
			Note: "reported", Filter: &BulkFilter{Reason: ReasonReportedUncertain}})
		require.NoError(t, err)
		require.Equal(t, []JobItem{{OperationID: reported.OperationID, Result: ItemDone}}, mine.Items)
		require.Equal(t, StateFailed, opRow(t, b, reported.OperationID).State)

		// uncertain_before in the past matches nothing: an empty, completed job.
		empty, err := b.recon.BulkReconcileForOperator(bg, acct, BulkReconcileInput{JobID: "f-2", Status: StateFailed,
			Note: "n", Filter: &BulkFilter{UncertainBefore: time.Now().Add(-time.Hour)}})
		require.NoError(t, err)
		require.Empty(t, empty.Items)
		require.Equal(t, JobCompleted, empty.Status)

		got, err := b.dash.JobForOperator(bg, acct, job.ID)
		require.NoError(t, err)
		require.Equal(t, job.Items, got.Items)
		_, err = b.dash.JobForOperator(bg, operatorAcct(RoleAuditor, &[]int64{otherTenant(t, b).TenantID}[0]), job.ID)
		require.ErrorIs(t, err, ErrNotFound)
		_, err = b.dash.JobForOperator(bg, acct, "not-a-uuid")
		require.ErrorIs(t, err, ErrNotFound)

		// Auditors are read-only.
		_, err = b.recon.BulkReconcileForOperator(bg, operatorAcct(RoleAuditor, nil), BulkReconcileInput{JobID: "f-3",
			Status: StateFailed, Note: "n", OperationIDs: []string{reported.OperationID}})
		require.ErrorIs(t, err, ErrUnauthorized)
	})
}

// TestBulkReconcileConcurrentSameJob: 20 requests with the same job id at once make one job;
// every one returns it completed with the same results, and each operation has exactly one
// outcome event.
func TestBulkReconcileConcurrentSameJob(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		var ids []string
		for i := range 8 {
			ids = append(ids, quickUncertain(t, b, b.p, fmt.Sprintf("bulkc/%d", i)).OperationID)
		}
		in := BulkReconcileInput{JobID: "same", Status: StateSucceeded, Note: "confirmed", OperationIDs: ids}
		const n = 20
		jobs := make([]*ReconciliationJob, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				jobs[i], errs[i] = b.recon.BulkReconcileForAPI(bg, b.p, in)
			}()
		}
		close(start)
		wg.Wait()
		created := 0
		for i := range n {
			require.NoError(t, errs[i])
			if jobs[i].Created {
				created++
			}
			require.Equal(t, jobs[0].ID, jobs[i].ID)
			require.Equal(t, JobCompleted, jobs[i].Status)
			require.Equal(t, 8, jobs[i].Done, "every call sees every operation done by the job")
		}
		require.Equal(t, 1, created)
		var count int64
		require.NoError(t, b.db.Model(&models.ReconciliationJob{}).Where("scope = ? AND job_key = ?",
			fmt.Sprintf("tenant:%d", b.p.TenantID), "same").Count(&count).Error)
		require.EqualValues(t, 1, count)
		for _, id := range ids {
			require.EqualValues(t, 1, outcomeEvents(t, b, id), id)
			require.Equal(t, StateSucceeded, opRow(t, b, id).State)
		}
	})
}

func TestBulkReconcileValidation(t *testing.T) {
	long := strings.Repeat("x", MaxJobIDBytes+1)
	many := make([]string, MaxBulkOperations+1)
	for i := range many {
		many[i] = fmt.Sprintf("00000000-0000-0000-0000-%012d", i)
	}
	for _, c := range []struct {
		in    BulkReconcileInput
		field string
	}{
		{BulkReconcileInput{Status: "failed", Note: "n", OperationIDs: many[:1]}, "job_id"},
		{BulkReconcileInput{JobID: long, Status: "failed", Note: "n", OperationIDs: many[:1]}, "job_id"},
		{BulkReconcileInput{JobID: "a b", Status: "failed", Note: "n", OperationIDs: many[:1]}, "job_id"},
		{BulkReconcileInput{JobID: "j", Status: "uncertain", Note: "n", OperationIDs: many[:1]}, "status"},
		{BulkReconcileInput{JobID: "j", Status: "failed", Note: "  ", OperationIDs: many[:1]}, "note"},
		{BulkReconcileInput{JobID: "j", Status: "failed", Note: "n"}, "operation_ids"},
		{BulkReconcileInput{JobID: "j", Status: "failed", Note: "n", OperationIDs: many}, "operation_ids"},
		{BulkReconcileInput{JobID: "j", Status: "failed", Note: "n", OperationIDs: []string{"nope"}}, "operation_ids"},
		{BulkReconcileInput{JobID: "j", Status: "failed", Note: "n", OperationIDs: many[:1], Filter: &BulkFilter{}}, "filter"},
		{BulkReconcileInput{JobID: "j", Status: "failed", Note: "n", Filter: &BulkFilter{Reason: "DROP TABLE"}}, "filter.reason"},
	} {
		err := c.in.Validate()
		require.True(t, isCode(err, CodeInvalidRequest), "%+v: %v", c.in, err)
		var fields []string
		for _, f := range err.(*Error).Fields {
			fields = append(fields, f.Field)
		}
		require.Contains(t, fields, c.field, "%+v", c.in)
	}
	ok := BulkReconcileInput{JobID: "A.b_c:d-1", Status: "succeeded", Note: "n", Filter: &BulkFilter{Reason: ReasonTTLExpired}}
	require.NoError(t, ok.Validate())
}

// FuzzBulkReconcileValidate: Validate never panics, and what it accepts is within the limits
// (valid job id, at most MaxBulkOperations distinct canonical ids, exactly one selection).
func FuzzBulkReconcileValidate(f *testing.F) {
	f.Add("job-1", "failed", "note", "6f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9", "", false)
	f.Add("", "succeeded", " ", "x", "ttl_expired_without_outcome", true)
	f.Add("j\x00", "failed", "\xff", "6F1E2D3C-4B5A-4978-8695-A4B3C2D1E0F9,6f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9", "Reason", true)
	f.Fuzz(func(t *testing.T, jobID, status, note, idList, reason string, useFilter bool) {
		in := BulkReconcileInput{JobID: jobID, Status: status, Note: note}
		if idList != "" {
			in.OperationIDs = strings.Split(idList, ",")
		}
		if useFilter {
			in.Filter = &BulkFilter{Reason: reason}
		}
		if err := in.Validate(); err != nil {
			if !isCode(err, CodeInvalidRequest) {
				t.Fatalf("not invalid_request: %v", err)
			}
			return
		}
		if !ValidJobID(in.JobID) || (in.Filter == nil) == (len(in.OperationIDs) == 0) || len(in.OperationIDs) > MaxBulkOperations {
			t.Fatalf("accepted %+v", in)
		}
		seen := map[string]bool{}
		for _, id := range in.OperationIDs {
			if seen[id] || id != strings.ToLower(id) || len(id) != 36 {
				t.Fatalf("id %q not canonical or repeated in %v", id, in.OperationIDs)
			}
			seen[id] = true
		}
	})
}

// TestBulkReconcileCutOffSaysPartlyDone: a job cut off by the database (here: one of its
// operations is row-locked past the request's deadline) is answered store_unavailable with a
// message that says the job exists and may be partly done — not the generic "retry later",
// which tells the caller nothing happened — and the same request again finishes it, each
// operation reconciled once. Found by a break-it trial (a 503 left a half-done job behind).
func TestBulkReconcileCutOffSaysPartlyDone(t *testing.T) {
	onPostgres(t, func(t *testing.T, b *testBundle) {
		first := quickUncertain(t, b, b.p, "bulk-cut/first")
		locked := quickUncertain(t, b, b.p, "bulk-cut/locked")
		locker := b.db.Begin()
		require.NoError(t, locker.Error)
		defer locker.Rollback()
		require.NoError(t, locker.Exec("SELECT 1 FROM operations WHERE id = ? FOR UPDATE", locked.OperationID).Error)

		in := BulkReconcileInput{JobID: "cut-1", Status: StateFailed, Note: "declined",
			OperationIDs: []string{first.OperationID, locked.OperationID}}
		ctx, cancel := context.WithTimeout(bg, 500*time.Millisecond) // the request's store deadline
		defer cancel()
		_, err := b.recon.BulkReconcileForAPI(ctx, b.p, in)
		var de *Error
		require.ErrorAs(t, err, &de)
		require.Equal(t, CodeStoreUnavailable, de.Code)
		require.Contains(t, de.Message, "partly done")
		require.EqualValues(t, 1, outcomeEvents(t, b, first.OperationID), "the first operation was reconciled before the cut")

		require.NoError(t, locker.Rollback().Error)
		job, err := b.recon.BulkReconcileForAPI(bg, b.p, in)
		require.NoError(t, err)
		require.False(t, job.Created)
		require.Equal(t, JobCompleted, job.Status)
		require.Equal(t, 2, job.Done)
		for _, id := range []string{first.OperationID, locked.OperationID} {
			require.EqualValues(t, 1, outcomeEvents(t, b, id), "reconciled once: %s", id)
		}
	})
}
