package services

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/idemgate/idemgate/models"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// Bulk reconciliation (docs/reference.md §10 "Bulk reconciliation"): one outcome and note
// applied to many uncertain operations as one idempotent job.
const (
	// MaxBulkOperations bounds one job: at most this many operation ids, and a filter takes
	// at most this many of the oldest matching operations (the job says Limited when more
	// matched; run another job for the rest).
	MaxBulkOperations = 500
	// MaxJobIDBytes bounds a client's job id.
	MaxJobIDBytes = 128

	JobRunning   = "running"   // some operations have no item yet
	JobCompleted = "completed" // every operation has an item

	ItemDone    = "done"    // reconciled by this job, with its own event
	ItemSkipped = "skipped" // left alone: Detail says why

	SelectionIDs    = "operation_ids" // the job names its operations
	SelectionFilter = "filter"        // the job took the queue's operations matching a filter
)

// BulkFilter selects the uncertain operations of a bulk job by the queue's filter: Reason
// (a state reason code, "" for any) and UncertainBefore (zero for any). TenantID narrows a
// global account's job to one tenant; it is ignored for API keys and tenant-restricted
// accounts, which only ever see their own tenant.
type BulkFilter struct {
	TenantID        *int64
	Reason          string
	UncertainBefore time.Time
}

// BulkReconcileInput is one bulk reconciliation request. JobID is the client's idempotency
// key for the job (1 to 128 bytes of [A-Za-z0-9._:-]): the same JobID with the same request
// is the same job. Status is succeeded or failed; Note is mandatory (1 to 1000 characters).
// Exactly one of OperationIDs (1 to MaxBulkOperations UUIDs) and Filter is set.
type BulkReconcileInput struct {
	JobID        string
	Status       string
	Note         string
	OperationIDs []string
	Filter       *BulkFilter
}

// ValidJobID reports whether s is a usable job id: 1 to MaxJobIDBytes bytes of
// [A-Za-z0-9._:-].
func ValidJobID(s string) bool {
	if s == "" || len(s) > MaxJobIDBytes {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == ':' || c == '-') {
			return false
		}
	}
	return true
}

// Validate checks in and normalises its operation ids (lower-case, hyphenated, duplicates
// dropped, order kept). Errors: ErrInvalidRequest naming fields job_id, status, note,
// operation_ids, filter.reason.
func (in *BulkReconcileInput) Validate() error {
	var fe []FieldError
	if !ValidJobID(in.JobID) {
		fe = append(fe, FieldError{Field: "job_id", Message: fmt.Sprintf("must be 1 to %d characters of A-Z a-z 0-9 . _ : -", MaxJobIDBytes)})
	}
	switch in.Status {
	case StateSucceeded, StateFailed:
	case "":
		fe = append(fe, FieldError{Field: "status", Message: "is required: succeeded or failed"})
	default:
		fe = append(fe, FieldError{Field: "status", Message: "must be succeeded or failed"})
	}
	if msg := requiredText(in.Note, MaxNoteChars); msg != "" {
		fe = append(fe, FieldError{Field: "note", Message: msg})
	}
	switch {
	case in.Filter == nil && len(in.OperationIDs) == 0:
		fe = append(fe, FieldError{Field: "operation_ids", Message: "or filter is required"})
	case in.Filter != nil && len(in.OperationIDs) > 0:
		fe = append(fe, FieldError{Field: "filter", Message: "must not be given together with operation_ids"})
	case len(in.OperationIDs) > MaxBulkOperations:
		fe = append(fe, FieldError{Field: "operation_ids", Message: fmt.Sprintf("must list at most %d operations", MaxBulkOperations)})
	case len(in.OperationIDs) > 0:
		seen := make(map[string]bool, len(in.OperationIDs))
		ids := make([]string, 0, len(in.OperationIDs))
		for _, raw := range in.OperationIDs {
			u, err := uuid.Parse(raw)
			if err != nil || len(raw) != 36 {
				fe = append(fe, FieldError{Field: "operation_ids", Message: "must be operation ids (UUIDs)"})
				break
			}
			if id := u.String(); !seen[id] {
				seen[id] = true
				ids = append(ids, id)
			}
		}
		in.OperationIDs = ids
	}
	if f := in.Filter; f != nil {
		if len(f.Reason) > 64 || !isReasonCode(f.Reason) {
			fe = append(fe, FieldError{Field: "filter.reason", Message: "must be a reason code such as ttl_expired_without_outcome"})
		}
	}
	if len(fe) > 0 {
		return invalid(fe...)
	}
	return nil
}

// isReasonCode reports whether s is empty or made of a-z and "_" only.
func isReasonCode(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= 'a' && c <= 'z' || c == '_') {
			return false
		}
	}
	return true
}

// JobItem is what a bulk job did to one operation: Result ItemDone or ItemSkipped, Detail
// why it was skipped; an operation not processed yet (a running job) has Result "".
type JobItem struct {
	OperationID string
	Result      string
	Detail      string
}

// ReconciliationJob is a bulk job and its per-operation results, Items in the order the job
// took the operations. Created is true for the call that created the job, false for a
// repeat of the same job id.
type ReconciliationJob struct {
	ID         string
	JobID      string
	Actor      string
	Status     string
	Outcome    string
	Note       string
	Selection  string
	Filter     *BulkFilter
	Limited    bool
	Total      int
	Done       int
	Skipped    int
	CreatedAt  time.Time
	FinishedAt *time.Time
	Items      []JobItem
	Created    bool
}

// storedFilter is a BulkFilter as the job row keeps it (JSON).
type storedFilter struct {
	TenantID        *int64 `json:"tenant_id,omitempty"`
	Reason          string `json:"reason,omitempty"`
	UncertainBefore string `json:"uncertain_before,omitempty"`
}

// BulkReconcileForOperator runs a bulk reconciliation for a signed-in operator (the queue
// page's form), recorded as the operator's username. Errors: ErrUnauthorized (an auditor),
// as bulkReconcile.
func (rc *Reconciliation) BulkReconcileForOperator(ctx context.Context, acct *OperatorAccount, in BulkReconcileInput) (*ReconciliationJob, error) {
	if err := canAct(acct); err != nil {
		return nil, err
	}
	if acct == nil {
		return nil, ErrUnauthorized
	}
	scope, tenant := "global", acct.TenantID
	if tenant != nil {
		scope = "tenant:" + strconv.FormatInt(*tenant, 10)
	} else if in.Filter != nil {
		tenant = in.Filter.TenantID
	}
	return rc.bulkReconcile(ctx, scope, acct.Username, acct.TenantID, tenant, in)
}

// BulkReconcileForAPI runs a bulk reconciliation for an API key (POST /v1/reconciliations),
// over the key's tenant only, recorded as "api:<key prefix>". Errors: as bulkReconcile.
func (rc *Reconciliation) BulkReconcileForAPI(ctx context.Context, p Principal, in BulkReconcileInput) (*ReconciliationJob, error) {
	t := p.TenantID
	if in.Filter != nil {
		in.Filter.TenantID = nil
	}
	return rc.bulkReconcile(ctx, "tenant:"+strconv.FormatInt(t, 10), "api:"+p.Prefix, &t, &t, in)
}

// bulkReconcile creates the job of (scope, in.JobID), or finds it when it exists, then
// reconciles every operation of it that has no item yet, each in its own transaction with
// its own event written by actor, and returns the job. visible restricts the operations to
// one tenant (nil: any); jobTenant is the tenant recorded on the job. Several calls for the
// same job at once are safe: each operation gets one item and at most one event whichever
// call reaches it, and every call returns the same completed job.
//
// Errors: ErrInvalidRequest (see BulkReconcileInput.Validate), ErrJobIDReused (the job id
// was used for another request), ErrStoreUnavailable.
func (rc *Reconciliation) bulkReconcile(ctx context.Context, scope, actor string, visible, jobTenant *int64, in BulkReconcileInput) (*ReconciliationJob, error) {
	if err := in.Validate(); err != nil {
		return nil, err
	}
	hash := bulkRequestHash(in)
	job, created, err := rc.createJob(ctx, scope, actor, visible, jobTenant, in, hash)
	if err != nil {
		return nil, err
	}
	if job.Status == JobRunning {
		if err := rc.runJob(ctx, job, visible); err != nil {
			return nil, partlyDone(err)
		}
	}
	out, err := rc.loadJob(ctx, job.ID)
	if err != nil {
		return nil, err
	}
	out.Created = created
	return out, nil
}

// partlyDone is runJob's error as the caller must hear it: the job exists and may have
// reconciled some operations already, so a plain "database unavailable" (which says nothing
// happened) would be wrong. Its operations are reconciled at most once whoever finishes the
// job; sending the same request again (same job_id, same body) finishes it.
func partlyDone(err error) error {
	var de *Error
	if errors.As(err, &de) && de.Code == CodeStoreUnavailable {
		return &Error{Code: CodeStoreUnavailable, Message: "The job was created and may be partly done: " +
			"send the same request again (the same job_id and body) to finish it; no operation is reconciled twice.", err: err}
	}
	return err
}

// bulkRequestHash identifies what a job was asked to do, so a job id reused for another
// request is noticed: the outcome, the note and the selection (or filter).
func bulkRequestHash(in BulkReconcileInput) string {
	var f *storedFilter
	if in.Filter != nil {
		f = filterForStorage(in.Filter)
	}
	b, _ := json.Marshal(struct {
		Status string        `json:"s"`
		Note   string        `json:"n"`
		IDs    []string      `json:"i"`
		Filter *storedFilter `json:"f"`
	}{in.Status, in.Note, in.OperationIDs, f})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func filterForStorage(f *BulkFilter) *storedFilter {
	s := &storedFilter{TenantID: f.TenantID, Reason: f.Reason}
	if !f.UncertainBefore.IsZero() {
		s.UncertainBefore = f.UncertainBefore.UTC().Format(time.RFC3339Nano)
	}
	return s
}

// createJob inserts the job of (scope, in.JobID) with its selection frozen (a filter is
// resolved to the oldest MaxBulkOperations matching uncertain operations now), or returns the
// existing one; created reports which.
func (rc *Reconciliation) createJob(ctx context.Context, scope, actor string, visible, jobTenant *int64,
	in BulkReconcileInput, hash string) (*models.ReconciliationJob, bool, error) {
	tx := rc.db.WithContext(ctx)
	existing := func() (*models.ReconciliationJob, error) {
		var js []models.ReconciliationJob
		if err := tx.Where("scope = ? AND job_key = ?", scope, in.JobID).Limit(1).Find(&js).Error; err != nil {
			return nil, storeError("get reconciliation job", err)
		}
		if len(js) == 0 {
			return nil, nil
		}
		if js[0].RequestHash != hash {
			return nil, &Error{Code: CodeJobIDReused, Message: "This job_id was already used for a job with another outcome, note or selection; nothing was changed. Use a new job_id."}
		}
		return &js[0], nil
	}
	if j, err := existing(); err != nil || j != nil {
		return j, false, err
	}
	ids := in.OperationIDs
	selection, limited := SelectionIDs, false
	var filterJSON *string
	if in.Filter != nil {
		selection = SelectionFilter
		b, _ := json.Marshal(filterForStorage(in.Filter))
		s := string(b)
		filterJSON = &s
		q := tx.Model(&models.Operation{}).Where("state = ?", StateUncertain)
		if t := visible; t != nil {
			q = q.Where("tenant_id = ?", *t)
		} else if t := in.Filter.TenantID; t != nil {
			q = q.Where("tenant_id = ?", *t)
		}
		q = whereReason(q, in.Filter.Reason)
		if !in.Filter.UncertainBefore.IsZero() {
			q = q.Where("uncertain_at < ?", in.Filter.UncertainBefore.UTC())
		}
		if err := q.Order("uncertain_at, id").Limit(MaxBulkOperations+1).Pluck("id", &ids).Error; err != nil {
			return nil, false, storeError("create reconciliation job", err)
		}
		if len(ids) > MaxBulkOperations {
			ids, limited = ids[:MaxBulkOperations], true
		}
	}
	if ids == nil {
		ids = []string{}
	}
	idsJSON, _ := json.Marshal(ids)
	now, err := rc.db.Now(ctx, tx)
	if err != nil {
		return nil, false, storeError("create reconciliation job", err)
	}
	j := &models.ReconciliationJob{ID: uuid.NewString(), Scope: scope, JobKey: in.JobID, TenantID: jobTenant,
		Actor: actor, Status: JobRunning, Outcome: in.Status, Note: in.Note, Selection: selection, Filter: filterJSON,
		OperationIDs: string(idsJSON), RequestHash: hash, Limited: limited, Total: len(ids), CreatedAt: now}
	var inserted int64
	err = rc.db.Write(ctx, func(db *gorm.DB) error {
		res := db.Clauses(clause.OnConflict{Columns: []clause.Column{{Name: "scope"}, {Name: "job_key"}}, DoNothing: true}).Create(j)
		inserted = res.RowsAffected
		return res.Error
	})
	if err != nil {
		return nil, false, storeError("create reconciliation job", err)
	}
	if inserted == 0 { // a concurrent request created it first
		j, err := existing()
		if err == nil && j == nil {
			err = storeError("create reconciliation job", errors.New("job vanished after a conflict"))
		}
		return j, false, err
	}
	return j, true, nil
}

// errItemTaken rolls back an operation's transaction when another request working on the same
// job wrote its item first.
var errItemTaken = errors.New("item written by a concurrent request")

// runJob reconciles every operation of job without an item yet, each in its own transaction:
// lock the operation, reconcile it if it is still uncertain (and visible), and write its item
// in the same transaction. Then it marks the job completed with its counts.
func (rc *Reconciliation) runJob(ctx context.Context, job *models.ReconciliationJob, visible *int64) error {
	var ids []string
	if err := json.Unmarshal([]byte(job.OperationIDs), &ids); err != nil {
		return storeError("run reconciliation job", err)
	}
	var doneIDs []string
	if err := rc.db.WithContext(ctx).Model(&models.ReconciliationJobItem{}).Where("job_id = ?", job.ID).
		Pluck("operation_id", &doneIDs).Error; err != nil {
		return storeError("run reconciliation job", err)
	}
	have := make(map[string]bool, len(doneIDs))
	for _, id := range doneIDs {
		have[id] = true
	}
	note := job.Note
	for _, id := range ids {
		if have[id] {
			continue
		}
		changed := false
		var decided Decision
		err := rc.db.Tx(ctx, func(tx *gorm.DB) error {
			now, err := rc.db.Now(ctx, tx)
			if err != nil {
				return err
			}
			item := models.ReconciliationJobItem{JobID: job.ID, OperationID: id, Result: ItemSkipped, CreatedAt: now}
			// The key row before the operation when a success may protect it (lockKeyForHorizon).
			var seen models.Operation
			if err := tx.Select("id", "key_id", "horizon_seconds").Where("id = ?", id).Take(&seen).Error; err == nil {
				if err := lockKeyForHorizon(tx, rc.st, &seen, job.Outcome); err != nil {
					return err
				}
			} else if !errors.Is(err, gorm.ErrRecordNotFound) {
				return err
			}
			q := rc.st.lock(tx).Where("id = ?", id)
			if visible != nil {
				q = q.Where("tenant_id = ?", *visible)
			}
			var ops []models.Operation
			if err := q.Limit(1).Find(&ops).Error; err != nil {
				return err
			}
			switch {
			case len(ops) == 0:
				item.Detail = "not found"
			case ops[0].State != StateUncertain:
				item.Detail = "no longer uncertain: now " + ops[0].State
			}
			// The item first: when another request wrote it meanwhile, nothing else happens.
			res := tx.Clauses(clause.OnConflict{DoNothing: true}).Create(&item)
			if res.Error != nil {
				return res.Error
			}
			if res.RowsAffected == 0 {
				return errItemTaken
			}
			if item.Detail != "" {
				return nil
			}
			op := &ops[0]
			if changed, err = applyOutcome(tx, op, job.Outcome, nil, rawJSON(op.OutcomeResponse), &note, false, job.Actor, now); err != nil {
				return err
			}
			decided = Decision{Key: op.Key, OperationID: op.ID, FencingToken: op.FencingToken}
			return tx.Model(&models.ReconciliationJobItem{}).Where("job_id = ? AND operation_id = ?", job.ID, id).
				Update("result", ItemDone).Error
		})
		if errors.Is(err, errItemTaken) {
			continue
		}
		observeOutcome(ctx, rc.obs, SourceOperator, job.Outcome, changed, err, decided)
		if err != nil {
			return storeError("run reconciliation job", err)
		}
	}
	return rc.db.Tx(ctx, func(tx *gorm.DB) error {
		var done, skipped int64
		if err := tx.Model(&models.ReconciliationJobItem{}).Where("job_id = ? AND result = ?", job.ID, ItemDone).Count(&done).Error; err != nil {
			return storeError("finish reconciliation job", err)
		}
		if err := tx.Model(&models.ReconciliationJobItem{}).Where("job_id = ? AND result = ?", job.ID, ItemSkipped).Count(&skipped).Error; err != nil {
			return storeError("finish reconciliation job", err)
		}
		now, err := rc.db.Now(ctx, tx)
		if err != nil {
			return storeError("finish reconciliation job", err)
		}
		err = tx.Model(&models.ReconciliationJob{}).Where("id = ? AND status = ?", job.ID, JobRunning).
			Updates(map[string]any{"status": JobCompleted, "done": done, "skipped": skipped, "finished_at": now}).Error
		return storeError("finish reconciliation job", err)
	})
}

// loadJob reads job id with its items in the job's order.
func (r *reader) loadJob(ctx context.Context, id string) (*ReconciliationJob, error) {
	tx := r.db.WithContext(ctx)
	var js []models.ReconciliationJob
	if err := tx.Where("id = ?", id).Limit(1).Find(&js).Error; err != nil {
		return nil, storeError("get reconciliation job", err)
	}
	if len(js) == 0 {
		return nil, ErrNotFound
	}
	j := js[0]
	var ids []string
	if err := json.Unmarshal([]byte(j.OperationIDs), &ids); err != nil {
		return nil, storeError("get reconciliation job", err)
	}
	var items []models.ReconciliationJobItem
	if err := tx.Where("job_id = ?", id).Find(&items).Error; err != nil {
		return nil, storeError("get reconciliation job", err)
	}
	byID := make(map[string]models.ReconciliationJobItem, len(items))
	for _, it := range items {
		byID[it.OperationID] = it
	}
	out := &ReconciliationJob{ID: j.ID, JobID: j.JobKey, Actor: j.Actor, Status: j.Status, Outcome: j.Outcome, Note: j.Note,
		Selection: j.Selection, Limited: j.Limited, Total: j.Total, Done: j.Done, Skipped: j.Skipped,
		CreatedAt: j.CreatedAt.UTC(), Items: make([]JobItem, 0, len(ids))}
	if j.FinishedAt != nil {
		t := j.FinishedAt.UTC()
		out.FinishedAt = &t
	}
	if j.Filter != nil {
		var sf storedFilter
		if err := json.Unmarshal([]byte(*j.Filter), &sf); err == nil {
			f := &BulkFilter{TenantID: sf.TenantID, Reason: sf.Reason}
			if sf.UncertainBefore != "" {
				f.UncertainBefore, _ = time.Parse(time.RFC3339Nano, sf.UncertainBefore)
			}
			out.Filter = f
		}
	}
	for _, id := range ids {
		it := byID[id]
		out.Items = append(out.Items, JobItem{OperationID: id, Result: it.Result, Detail: it.Detail})
	}
	return out, nil
}
