package services

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/idemgate/idemgate/models"
	"gorm.io/gorm"
)

// Dashboard answers the operator dashboard's reads, across tenants for a global account. Its
// writes are Reconciliation's; its audit is Audit's. Each page's reads are in one place:
//   - the Keys page, and the tenant names and lookups every page's filters use: this file;
//   - an operation's detail page and a bulk job's page: this file, after the Keys page;
//   - the overview, and the reconciliation gauge of /metrics: overview.go;
//   - the reconciliation queue: queue.go, beside the API's operation list, whose query it
//     shares.
//
// Safe for concurrent use.
type Dashboard struct {
	reader
}

// NewDashboard returns a Dashboard over db.
func NewDashboard(db *models.DB) *Dashboard { return &Dashboard{reader{db: db, st: newStore(db)}} }

// TenantKeyView is a key as the dashboard lists it: the key and its newest operation, plus the
// tenant it belongs to (global accounts see every tenant's keys side by side).
type TenantKeyView struct {
	KeyView
	TenantID   int64
	TenantName string
}

// OperatorKeyPage is one page of the dashboard's key list, newest acquisition first.
// NextCursor is "" on the last page; PrevCursor (for KeyFilter.Before) is "" on the first.
// Now is the database time the holds were judged at, so
// the dashboard computes TTLs against the same clock that decides expiry (docs/reference.md §6), not
// against the web server's.
type OperatorKeyPage struct {
	Items      []TenantKeyView
	NextCursor string
	PrevCursor string
	Now        time.Time
}

// ListKeysForOperator lists keys for a dashboard account, newest acquisition first with the
// same keyset pagination and filters as ListKeys. tenantID nil (a global account) lists the
// keys of every tenant; otherwise only that tenant's (docs/reference.md §5). Errors: ErrInvalidRequest
// (bad limit, state, operation or cursor), ErrStoreUnavailable.
func (ds *Dashboard) ListKeysForOperator(ctx context.Context, tenantID *int64, f KeyFilter) (*OperatorKeyPage, error) {
	page, ks, now, err := ds.listKeys(ctx, tenantID, f)
	if err != nil {
		return nil, err
	}
	names, err := ds.tenantNames(ctx, ks)
	if err != nil {
		return nil, storeError("list keys", err)
	}
	out := &OperatorKeyPage{Items: make([]TenantKeyView, 0, len(page.Items)), NextCursor: page.NextCursor, PrevCursor: page.PrevCursor, Now: now}
	for i, v := range page.Items {
		// listKeys returns the rows and their views in the same order.
		out.Items = append(out.Items, TenantKeyView{KeyView: v, TenantID: ks[i].TenantID, TenantName: names[ks[i].TenantID]})
	}
	return out, nil
}

// TenantName returns the name of tenant id. Errors: ErrNotFound, ErrStoreUnavailable.
func (ds *Dashboard) TenantName(ctx context.Context, id int64) (string, error) {
	var ts []models.Tenant
	if err := ds.db.WithContext(ctx).Where("id = ?", id).Limit(1).Find(&ts).Error; err != nil {
		return "", storeError("get tenant", err)
	}
	if len(ts) == 0 {
		return "", ErrNotFound
	}
	return ts[0].Name, nil
}

// tenantNames maps the tenant ids of ks to tenant names with one query for the page.
func (r *reader) tenantNames(ctx context.Context, ks []models.IdemKey) (map[int64]string, error) {
	names := map[int64]string{}
	if len(ks) == 0 {
		return names, nil
	}
	seen := map[int64]bool{}
	ids := make([]int64, 0, 4)
	for _, k := range ks {
		if !seen[k.TenantID] {
			seen[k.TenantID] = true
			ids = append(ids, k.TenantID)
		}
	}
	var ts []models.Tenant
	if err := r.db.WithContext(ctx).Where("id IN ?", ids).Find(&ts).Error; err != nil {
		return nil, err
	}
	for _, t := range ts {
		names[t.ID] = t.Name
	}
	return names, nil
}

// TenantRef names one tenant for the dashboard's tenant filters and pickers.
type TenantRef struct {
	ID   int64
	Name string
}

// MaxTenantChoices bounds how many tenants a filter's select lists; beyond it the list is cut
// (by name) rather than rendering an unbounded page.
const MaxTenantChoices = 1000

// Tenants lists the tenants by name, at most MaxTenantChoices, for global accounts' tenant
// filters. Errors: ErrStoreUnavailable.
func (ds *Dashboard) Tenants(ctx context.Context) ([]TenantRef, error) {
	var ts []models.Tenant
	if err := ds.db.WithContext(ctx).Order("name, id").Limit(MaxTenantChoices).Find(&ts).Error; err != nil {
		return nil, storeError("list tenants", err)
	}
	out := make([]TenantRef, 0, len(ts))
	for _, t := range ts {
		out = append(out, TenantRef{ID: t.ID, Name: t.Name})
	}
	return out, nil
}

// TenantID returns the id of the tenant named name, for the dashboard's filters, which name
// tenants by name on every page (Keys, Reconciliation, Audit; issue 28). A name no tenant has
// gives 0, an id no tenant has, so the filter matches nothing, as the audit's does.
// Errors: ErrStoreUnavailable.
func (ds *Dashboard) TenantID(ctx context.Context, name string) (int64, error) {
	var ids []int64
	if err := ds.db.WithContext(ctx).Model(&models.Tenant{}).Where("name = ?", name).Limit(1).Pluck("id", &ids).Error; err != nil {
		return 0, storeError("find tenant", err)
	}
	if len(ids) == 0 {
		return 0, nil
	}
	return ids[0], nil
}

// KeyCountCap is where the Keys page's total stops counting: past it the page says
// "1,000+ keys". An exact count over a million keys reads every row on each page load; a capped
// one stops after KeyCountCap+1 matches. The cap was 10,000 until a state filter was measured
// at size: its count probes a key row for each operation it walks, so its cost follows the cap
// however large the database (docs/reference.md §5; figures:
// docs/operations.md "Figures behind the code").
const KeyCountCap = 1000

// KeyCount is the Keys page's total: N keys match, or more than Cap when Capped.
type KeyCount struct {
	N      int64
	Capped bool
}

// CountKeys counts the keys under f's filter (State, Operation, KeyPrefix, ExpiringWithin;
// Limit and the cursors are ignored) over one tenant, or every tenant when tenantID is nil,
// stopping at KeyCountCap. f is a filter ListKeysForOperator accepted. Errors:
// ErrStoreUnavailable.
func (ds *Dashboard) CountKeys(ctx context.Context, tenantID *int64, f KeyFilter) (KeyCount, error) {
	tx := ds.db.WithContext(ctx)
	now, err := ds.db.Now(ctx, tx)
	if err != nil {
		return KeyCount{}, storeError("count keys", err)
	}
	q, atCol, idCol := keyFilterQuery(tx, ds.st, tenantID, f, now)
	var n int64
	if err := countKeysQuery(tx, q, atCol, idCol).Scan(&n).Error; err != nil {
		return KeyCount{}, storeError("count keys", err)
	}
	if n > KeyCountCap {
		return KeyCount{N: KeyCountCap, Capped: true}, nil
	}
	return KeyCount{N: n}, nil
}

// countKeysQuery counts the rows of filter q (from keyFilterQuery, with its order columns),
// stopping at KeyCountCap+1. In the list's order, so the count walks the list's index and stops
// at the cap instead of joining every key, which is PostgreSQL's choice for an unordered LIMIT
// over a join, and slower at size (measured: docs/operations.md "Figures behind the code").
func countKeysQuery(tx, q *gorm.DB, atCol, idCol string) *gorm.DB {
	sub := q.Select("1").Order(atCol + " DESC, " + idCol + " DESC").Limit(KeyCountCap + 1)
	return tx.Raw("SELECT count(*) FROM (?) AS capped", sub)
}

// The operation detail page (/operations/{id}): OperationForOperator. The actions it offers are
// Reconciliation's (reconciliation.go), which checks them again.

// MaxGenerations bounds how many operations of one key OperationForOperator returns: the newest
// ones, so a key retried for years still renders one bounded page.
const MaxGenerations = 200

// Generation is one operation of a key, as listed beside its other operations: each admission
// of the key after the previous hold ended is a new generation with the next fencing token.
type Generation struct {
	ID           string
	FencingToken int64
	State        string
	AcquiredAt   time.Time
}

// OperatorOperation is an operation as the dashboard's detail page shows it (docs/reference.md §5): the
// operation with its attempts and events (OperationDetail), the tenant it belongs to, the key's
// current holder, and the key's generations.
type OperatorOperation struct {
	OperationDetail
	TenantID   int64
	TenantName string
	// Holder is the key's holder right now (this operation or another), nil when nobody
	// holds it. Its hold may have expired without being cleared yet (see HolderInfo).
	Holder *HolderInfo
	// HoldsKey is true when this operation is the key's holder, live or expired but not yet
	// cleared: exactly when OperatorRelease can release it (given a releasable state).
	HoldsKey bool
	// Generations are the key's operations by fencing token, oldest first: at most the newest
	// MaxGenerations.
	Generations []Generation
	// PossibleDuplicateOf are the key's earlier operations (lower fencing tokens) in state
	// succeeded or uncertain, newest first, at most MaxGenerations: this operation was admitted
	// while each had succeeded or was uncertain, so its effect may duplicate theirs (the audit's
	// "possible duplicate effect", judged the same way). Empty for none.
	PossibleDuplicateOf []Generation
	// Now is the database time the page was read at, the clock that decides expiry.
	Now time.Time
	// MayRecordOutcome and MayRelease say which actions the account it was read for may take
	// on it now (ReconcileOutcome, OperatorRelease), so the page offers only those.
	MayRecordOutcome bool
	MayRelease       bool
}

// OperationForOperator returns operation id for the dashboard's detail page (docs/reference.md §5): the
// operation with attempts and events, its tenant's name, the key's current holder and the key's
// generations. Global accounts (acct.TenantID nil) see every tenant. Errors: ErrNotFound (a
// malformed id, an unknown one, or another tenant's for a restricted account),
// ErrStoreUnavailable.
func (ds *Dashboard) OperationForOperator(ctx context.Context, acct *OperatorAccount, id string) (*OperatorOperation, error) {
	id, err := normaliseID(id)
	if err != nil {
		return nil, err
	}
	tx := ds.db.WithContext(ctx)
	m, err := ds.operatorOpRow(tx, acct, id)
	if err != nil {
		return nil, storeError("get operation", err)
	}
	d, err := ds.operation(ctx, m.TenantID, id)
	if err != nil {
		return nil, err
	}
	out := &OperatorOperation{OperationDetail: *d, TenantID: m.TenantID}
	if out.TenantName, err = ds.TenantName(ctx, m.TenantID); errors.Is(err, ErrNotFound) {
		out.TenantName = "" // tenants are never deleted today; show the id rather than fail
	} else if err != nil {
		return nil, err
	}
	if out.Now, err = ds.db.Now(ctx, tx); err != nil {
		return nil, storeError("get operation", err)
	}
	var ks []models.IdemKey
	if err := tx.Where("tenant_id = ? AND key = ?", m.TenantID, m.Key).Limit(1).Find(&ks).Error; err != nil {
		return nil, storeError("get operation", err)
	}
	if len(ks) == 1 && ks[0].HolderOperationID != nil {
		h, err := holderInfo(tx, &ks[0])
		if err != nil {
			return nil, storeError("get operation", err)
		}
		out.Holder = h
		out.HoldsKey = h.OperationID == id
	}
	var gens []models.Operation
	if err := tx.Select("id", "fencing_token", "state", "acquired_at").
		Where("key_id = ?", m.KeyID).
		Order("fencing_token DESC").Limit(MaxGenerations).Find(&gens).Error; err != nil {
		return nil, storeError("get operation", err)
	}
	slices.Reverse(gens)
	out.Generations = make([]Generation, 0, len(gens))
	for _, g := range gens {
		out.Generations = append(out.Generations, Generation{ID: g.ID, FencingToken: g.FencingToken, State: g.State,
			AcquiredAt: g.AcquiredAt.UTC()})
	}
	var earlier []models.Operation
	if err := tx.Select("id", "fencing_token", "state", "acquired_at").
		Where("key_id = ? AND fencing_token < ? AND state IN ?", m.KeyID, m.FencingToken, duplicateEffectStates).
		Order("fencing_token DESC").Limit(MaxGenerations).Find(&earlier).Error; err != nil {
		return nil, storeError("get operation", err)
	}
	for _, g := range earlier {
		out.PossibleDuplicateOf = append(out.PossibleDuplicateOf, Generation{ID: g.ID, FencingToken: g.FencingToken,
			State: g.State, AcquiredAt: g.AcquiredAt.UTC()})
	}
	out.MayRecordOutcome, out.MayRelease = operatorActions(acct, out)
	return out, nil
}

// A bulk reconciliation job's page (/reconciliation/jobs/{id}): JobForOperator and
// JobOperations. Jobs are made and run by Reconciliation (bulk.go).

// JobForOperator returns bulk job id (the job's own UUID) for the dashboard's job page. A
// tenant-restricted account sees only its tenant's jobs; another's answers ErrNotFound, as an
// unknown or malformed id does. Errors: ErrNotFound, ErrStoreUnavailable.
func (ds *Dashboard) JobForOperator(ctx context.Context, acct *OperatorAccount, id string) (*ReconciliationJob, error) {
	u, err := uuid.Parse(id)
	if err != nil || acct == nil {
		return nil, ErrNotFound
	}
	q := ds.db.WithContext(ctx).Model(&models.ReconciliationJob{}).Where("id = ?", u.String())
	if acct.TenantID != nil {
		q = q.Where("tenant_id = ?", *acct.TenantID)
	}
	var n int64
	if err := q.Count(&n).Error; err != nil {
		return nil, storeError("get reconciliation job", err)
	}
	if n == 0 {
		return nil, ErrNotFound
	}
	return ds.loadJob(ctx, u.String())
}

// JobOperation names one operation of a job for its page: the idempotency key and the
// tenant's name.
type JobOperation struct {
	Key    string
	Tenant string
}

// JobOperations returns, for the operation ids of a job (at most MaxBulkOperations), the key
// and tenant of each one acct may see, so the job page lists keys rather than bare ids
// (issue 28). An id acct may not see, or whose operation retention purged, is absent.
// Errors: ErrStoreUnavailable.
func (ds *Dashboard) JobOperations(ctx context.Context, acct *OperatorAccount, ids []string) (map[string]JobOperation, error) {
	out := make(map[string]JobOperation, len(ids))
	if acct == nil || len(ids) == 0 {
		return out, nil
	}
	var rows []struct {
		ID     string
		Key    string
		Tenant string
	}
	q := ds.db.WithContext(ctx).Table("operations o").Select("o.id, o.key, t.name AS tenant").
		Joins("JOIN tenants t ON t.id = o.tenant_id").Where("o.id IN ?", ids[:min(len(ids), MaxBulkOperations)])
	if acct.TenantID != nil {
		q = q.Where("o.tenant_id = ?", *acct.TenantID)
	}
	if err := q.Scan(&rows).Error; err != nil {
		return nil, storeError("get job operations", err)
	}
	for _, r := range rows {
		out[r.ID] = JobOperation{Key: r.Key, Tenant: r.Tenant}
	}
	return out, nil
}
