package services

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/idemgate/idemgate/models"
	"gorm.io/gorm"
)

// OperationFilter selects operations for ListOperations. State is required and must be
// uncertain: the list is the reconciliation queue, ordered by the time each operation became
// uncertain, an order only that state has (other states are listed per key by ListKeys).
// Cursor is an opaque value from a previous page's NextCursor. Reason and UncertainBefore
// narrow the dashboard's queue (and a bulk reconciliation by filter): only operations whose
// state_reason is Reason ("" for any), and only those that became uncertain before
// UncertainBefore (zero for any). A cursor is valid only with the filter it was made with.
// Back, instead of Cursor, is a previous page's PrevCursor: the page just before that cursor
// in queue order (the dashboard's "Earlier" link), still oldest first. Setting both is
// refused (field "back").
type OperationFilter struct {
	State           string
	Limit           int
	Cursor          string
	Back            string
	Reason          string
	UncertainBefore time.Time
}

// QueuedOperation is one entry of the dashboard's reconciliation queue: the operation, its
// tenant, and when it became uncertain (UTC). Superseded is true when a later operation of the
// same key exists (a takeover after the hold expired), so listings by key show that one.
// TenantName is filled only for a queue over every tenant.
type QueuedOperation struct {
	Operation
	TenantID    int64
	TenantName  string
	UncertainAt time.Time
	Superseded  bool
}

// QueuePage is one page of the dashboard's reconciliation queue, oldest first. NextCursor is
// "" on the last page; PrevCursor, for OperationFilter.Back, leads to the entries before this
// page, "" when the page is known to be the first.
type QueuePage struct {
	Items      []QueuedOperation
	NextCursor string
	PrevCursor string
}

// ListOperations returns tenantID's reconciliation queue (TenantName left empty): every
// operation in state uncertain,
// superseded by a later operation of its key or not, oldest first by the time it became
// uncertain, with keyset pagination (limit 1 to MaxListLimit, default DefaultListLimit). Its
// length always equals the Overview's NeedsReconciliation and the metric, which count the same
// rows. Errors: ErrInvalidRequest (fields "state", "limit", "cursor"), ErrStoreUnavailable.
func (rd *Reads) ListOperations(ctx context.Context, tenantID int64, f OperationFilter) (*QueuePage, error) {
	return rd.listQueue(ctx, &tenantID, f)
}

// ReconciliationQueue is ListOperations for the dashboard: over one tenant, or every tenant
// when tenantID is nil (a global account), with each operation's tenant name. State defaults
// to uncertain. Errors: as ListOperations.
func (ds *Dashboard) ReconciliationQueue(ctx context.Context, tenantID *int64, f OperationFilter) (*QueuePage, error) {
	if f.State == "" {
		f.State = StateUncertain
	}
	return ds.listQueue(ctx, tenantID, f)
}

func (r *reader) listQueue(ctx context.Context, tenantID *int64, f OperationFilter) (*QueuePage, error) {
	var fe []FieldError
	if f.Limit == 0 {
		f.Limit = DefaultListLimit
	}
	if f.Limit < 1 || f.Limit > MaxListLimit {
		fe = append(fe, FieldError{Field: "limit", Message: fmt.Sprintf("must be an integer from 1 to %d", MaxListLimit)})
	}
	switch f.State {
	case StateUncertain:
	case "":
		fe = append(fe, FieldError{Field: "state", Message: "is required: uncertain"})
	default:
		fe = append(fe, FieldError{Field: "state", Message: "must be uncertain"})
	}
	if len(f.Reason) > 64 || strings.Trim(f.Reason, "abcdefghijklmnopqrstuvwxyz_") != "" {
		fe = append(fe, FieldError{Field: "reason", Message: "must be a reason code such as ttl_expired_without_outcome"})
	}
	curAt, curID, err := decodeQueueCursor(f.Cursor)
	if err != nil {
		fe = append(fe, FieldError{Field: "cursor", Message: "is not a cursor returned by this endpoint"})
	}
	backAt, backID, err := decodeQueueCursor(f.Back)
	if err != nil {
		fe = append(fe, FieldError{Field: "back", Message: "is not a cursor returned by this endpoint"})
	} else if f.Back != "" && f.Cursor != "" {
		fe = append(fe, FieldError{Field: "back", Message: "cannot be combined with cursor"})
	}
	if len(fe) > 0 {
		return nil, invalid(fe...)
	}
	tx := r.db.WithContext(ctx)
	now, err := r.db.Now(ctx, tx)
	if err != nil {
		return nil, storeError("list operations", err)
	}
	// The partial indexes operations_uncertain_queue(_all) hold exactly these rows in this
	// order, so a page is one index range however long the queue is.
	q := tx.Where("state = ?", StateUncertain)
	if tenantID != nil {
		q = q.Where("tenant_id = ?", *tenantID)
	}
	q = whereReason(q, f.Reason)
	if !f.UncertainBefore.IsZero() {
		q = q.Where("uncertain_at < ?", f.UncertainBefore.UTC())
	}
	if f.Cursor != "" {
		q = q.Where("(uncertain_at, id) > (?, ?)", curAt, curID)
	}
	order := "uncertain_at, id"
	if f.Back != "" {
		// Backwards: the entries just before the cursor, read along the same index the other
		// way and turned round below.
		q = q.Where("(uncertain_at, id) < (?, ?)", backAt, backID)
		order = "uncertain_at DESC, id DESC"
	}
	var ms []models.Operation
	if err := q.Order(order).Limit(f.Limit + 1).Find(&ms).Error; err != nil {
		return nil, storeError("list operations", err)
	}
	page := &QueuePage{Items: make([]QueuedOperation, 0, len(ms))}
	more := len(ms) > f.Limit
	if more {
		ms = ms[:f.Limit]
	}
	if f.Back != "" {
		slices.Reverse(ms)
	}
	if len(ms) > 0 {
		first, last := ms[0], ms[len(ms)-1]
		// Forwards, more rows lie after the page; backwards, before it. The other direction
		// has rows whenever a cursor led here (at least the row the cursor was made from).
		if (f.Back == "" && more) || f.Back != "" {
			page.NextCursor = encodeQueueCursor(derefTime(last.UncertainAt), last.ID)
		}
		if (f.Back != "" && more) || f.Cursor != "" {
			page.PrevCursor = encodeQueueCursor(derefTime(first.UncertainAt), first.ID)
		}
	}
	if len(ms) == 0 {
		return page, nil
	}
	// The keys of the page, through the unique index on (tenant_id, key): which operation is
	// each key's newest (the others are superseded) and which still holds it (an expired hold
	// not yet cleared does not count). IN over tenants × keys may match other pairs; they are
	// simply not looked up.
	tenants, keys := map[int64]bool{}, map[string]bool{}
	tids, knames := []int64{}, []string{}
	for _, m := range ms {
		if !tenants[m.TenantID] {
			tenants[m.TenantID] = true
			tids = append(tids, m.TenantID)
		}
		if !keys[m.Key] {
			keys[m.Key] = true
			knames = append(knames, m.Key)
		}
	}
	var ks []models.IdemKey
	if err := tx.Where("tenant_id IN ? AND key IN ?", tids, knames).Find(&ks).Error; err != nil {
		return nil, storeError("list operations", err)
	}
	newest, held := map[string]bool{}, map[string]bool{}
	for _, k := range ks {
		newest[strings.ToLower(k.LastOperationID)] = true
		if k.HolderOperationID != nil && k.ExpiresAt != nil && k.ExpiresAt.After(now) {
			held[strings.ToLower(*k.HolderOperationID)] = true
		}
	}
	names := map[int64]string{}
	if tenantID == nil {
		var ts []models.Tenant
		if err := tx.Where("id IN ?", tids).Find(&ts).Error; err != nil {
			return nil, storeError("list operations", err)
		}
		for _, t := range ts {
			names[t.ID] = t.Name
		}
	}
	if err := addCounters(tx, pointers(ms)...); err != nil {
		return nil, storeError("list operations", err)
	}
	for i := range ms {
		m := &ms[i]
		page.Items = append(page.Items, QueuedOperation{Operation: operationFromModel(m, held[m.ID]),
			TenantID: m.TenantID, TenantName: names[m.TenantID], UncertainAt: derefTime(m.UncertainAt),
			Superseded: !newest[m.ID]})
	}
	return page, nil
}

// encodeQueueCursor is the opaque cursor after the queue entry that became uncertain at t with
// operation id: base64url (no padding) of "<unix nanoseconds>.<uuid>".
func encodeQueueCursor(t time.Time, id string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(t.UnixNano(), 10) + "." + id))
}

// decodeQueueCursor parses a cursor made by encodeQueueCursor; "" is the first page (zero time
// and ""). The id comes back in the stored spelling (lower-case, hyphenated). Errors: any
// other input, including a valid cursor of another list.
func decodeQueueCursor(c string) (time.Time, string, error) {
	if c == "" {
		return time.Time{}, "", nil
	}
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return time.Time{}, "", err
	}
	ts, idStr, ok := strings.Cut(string(b), ".")
	if !ok {
		return time.Time{}, "", errors.New("malformed cursor")
	}
	ns, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return time.Time{}, "", errors.New("malformed cursor")
	}
	u, err := uuid.Parse(idStr)
	if err != nil || len(idStr) != 36 {
		return time.Time{}, "", errors.New("malformed cursor")
	}
	return time.Unix(0, ns).UTC(), u.String(), nil
}

// CountQueue counts the dashboard queue's operations under f's filter (State, Reason,
// UncertainBefore; Limit and Cursor are ignored), over one tenant or every tenant when
// tenantID is nil, for the queue page's total. The partial indexes of the queue serve it.
// Errors: ErrInvalidRequest (field "reason"), ErrStoreUnavailable.
func (ds *Dashboard) CountQueue(ctx context.Context, tenantID *int64, f OperationFilter) (int64, error) {
	if len(f.Reason) > 64 || strings.Trim(f.Reason, "abcdefghijklmnopqrstuvwxyz_") != "" {
		return 0, invalid(FieldError{Field: "reason", Message: "must be a reason code such as ttl_expired_without_outcome"})
	}
	q := ds.db.WithContext(ctx).Model(&models.Operation{}).Where("state = ?", StateUncertain)
	if tenantID != nil {
		q = q.Where("tenant_id = ?", *tenantID)
	}
	q = whereReason(q, f.Reason)
	if !f.UncertainBefore.IsZero() {
		q = q.Where("uncertain_at < ?", f.UncertainBefore.UTC())
	}
	var n int64
	if err := q.Count(&n).Error; err != nil {
		return 0, storeError("count queue", err)
	}
	return n, nil
}

// whereReason narrows q, over uncertain operations, to those of the queue reason reason: any
// for "", the owner-reported ones (no state_reason) for ReasonReportedUncertain, else those
// whose state_reason is reason.
func whereReason(q *gorm.DB, reason string) *gorm.DB {
	switch reason {
	case "":
		return q
	case ReasonReportedUncertain:
		return q.Where("state_reason IS NULL")
	default:
		return q.Where("state_reason = ?", reason)
	}
}
