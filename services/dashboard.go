package services

import (
	"context"
	"time"

	"github.com/idemgate/idemgate/models"
	"gorm.io/gorm"
)

// Dashboard answers the operator dashboard's reads, across tenants for a global account: the
// overview, the key list, the reconciliation queue, an operation's detail page and tenant
// names. Its writes are Reconciliation's; its audit is Audit's. Safe for concurrent use.
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
