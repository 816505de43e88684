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
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/idemgate/idemgate/models"
	"gorm.io/gorm"
)

// MaxListLimit bounds limit on list reads (docs/reference.md §4); DefaultListLimit applies when none is
// given.
const (
	MaxListLimit     = 500
	DefaultListLimit = 50
)

// reader is what the reading services share: the database and its store. Its methods are the
// queries more than one audience needs (a tenant's API reads and the dashboard's).
type reader struct {
	db *models.DB
	st store
}

// Reads answers a tenant's API reads: operations, keys, the attempt log and the operation
// list (with the reconciliation queue). Every method is scoped to one tenant id, the caller's.
// Safe for concurrent use.
type Reads struct {
	reader
}

// NewReads returns a Reads over db.
func NewReads(db *models.DB) *Reads { return &Reads{reader{db: db, st: newStore(db)}} }

// loadOperation reads operation id of tenantID with its hold status and attempt counts, as of
// the database time now.
func loadOperation(tx *gorm.DB, tenantID int64, id string, now time.Time) (*Operation, error) {
	var m models.Operation
	err := tx.Where("id = ? AND tenant_id = ?", id, tenantID).Take(&m).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, ErrNotFound
	} else if err != nil {
		return nil, err
	}
	var held int64
	if err := tx.Model(&models.IdemKey{}).
		Where("tenant_id = ? AND key = ? AND holder_operation_id = ? AND expires_at > ?", tenantID, m.Key, m.ID, now).
		Count(&held).Error; err != nil {
		return nil, err
	}
	if err := addCounters(tx, &m); err != nil {
		return nil, err
	}
	op := operationFromModel(&m, held > 0)
	return &op, nil
}

// GetOperation returns operation id of p's tenant with its attempts and events, oldest first
// (docs/reference.md §4). Errors: ErrNotFound (also for a malformed id or another tenant's operation, so
// existence does not leak), ErrStoreUnavailable.
func (rd *Reads) GetOperation(ctx context.Context, tenantID int64, id string) (*OperationDetail, error) {
	return rd.operation(ctx, tenantID, id)
}

// operation is GetOperation, for every audience.
func (r *reader) operation(ctx context.Context, tenantID int64, id string) (*OperationDetail, error) {
	u, err := uuid.Parse(id)
	if err != nil {
		return nil, ErrNotFound
	}
	id = u.String() // the stored spelling: PostgreSQL would match others, SQLite would not
	tx := r.db.WithContext(ctx)
	now, err := r.db.Now(ctx, tx)
	if err != nil {
		return nil, storeError("get operation", err)
	}
	op, err := loadOperation(tx, tenantID, id, now)
	if err != nil {
		return nil, storeError("get operation", err)
	}
	d := &OperationDetail{Operation: *op}
	var atts []models.Attempt
	if err := tx.Where("operation_id = ? AND tenant_id = ?", id, tenantID).Order("id").Limit(1000).Find(&atts).Error; err != nil {
		return nil, storeError("get operation", err)
	}
	for i := range atts {
		d.Attempts = append(d.Attempts, attemptFromModel(&atts[i]))
	}
	var evs []models.Event
	if err := tx.Where("operation_id = ? AND tenant_id = ?", id, tenantID).Order("id").Limit(1000).Find(&evs).Error; err != nil {
		return nil, storeError("get operation", err)
	}
	for _, e := range evs {
		d.Events = append(d.Events, Event{Kind: e.Kind, Actor: e.Actor, Detail: e.Detail, CreatedAt: e.CreatedAt.UTC()})
	}
	return d, nil
}

func attemptFromModel(m *models.Attempt) Attempt {
	return Attempt{ID: m.ID, Key: m.Key, OperationID: m.OperationID, Result: m.Result, AttemptID: m.AttemptID,
		Operation: m.OperationName, Fingerprint: m.Fingerprint, CorrelationID: m.CorrelationID, Caller: m.Caller,
		AttemptedAt: m.AttemptedAt.UTC()}
}

// GetKey returns key of p's tenant with its hold and newest operation (docs/reference.md §4). Errors:
// ErrNotFound if the key was never acquired in this tenant, ErrStoreUnavailable.
func (rd *Reads) GetKey(ctx context.Context, tenantID int64, key string) (*KeyView, error) {
	if ValidateKey(key) != "" {
		return nil, ErrNotFound
	}
	tx := rd.db.WithContext(ctx)
	var k models.IdemKey
	err := tx.Where("tenant_id = ? AND key = ?", tenantID, key).Take(&k).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, ErrNotFound
	} else if err != nil {
		return nil, storeError("get key", err)
	}
	now, err := rd.db.Now(ctx, tx)
	if err != nil {
		return nil, storeError("get key", err)
	}
	views, err := rd.keyViews(tx, []models.IdemKey{k}, now)
	if err != nil {
		return nil, storeError("get key", err)
	}
	return &views[0], nil
}

// KeyFilter selects keys for ListKeys. State and Operation filter on the key's newest
// operation. KeyPrefix keeps keys that start with it (byte-exact, like keys themselves).
// ExpiringWithin, when positive, keeps live holds that expire within that duration (the
// dashboard's "expiring soon"). Cursor is an opaque value from a previous page's next cursor.
// Before, instead of Cursor, is a previous page's PrevCursor: the page of keys just newer
// than that cursor (the dashboard's "Newer" link), still newest first. Setting both is
// refused (field "before").
type KeyFilter struct {
	State          string
	Operation      string
	KeyPrefix      string
	ExpiringWithin time.Duration
	Limit          int
	Cursor         string
	Before         string
}

// KeyPage is one page of keys, newest acquisition first. NextCursor is "" on the last page.
// PrevCursor, for KeyFilter.Before, leads to the newer keys; "" when the page is known to be
// the first (newest) one.
type KeyPage struct {
	Items      []KeyView
	NextCursor string
	PrevCursor string
}

// ListKeys lists p's tenant's keys newest acquisition first with keyset pagination (docs/reference.md
// §4). Errors: ErrInvalidRequest (bad limit, state or cursor), ErrStoreUnavailable.
func (rd *Reads) ListKeys(ctx context.Context, tenantID int64, f KeyFilter) (*KeyPage, error) {
	page, _, _, err := rd.listKeys(ctx, &tenantID, f)
	return page, err
}

// listKeys is ListKeys over one tenant, or over every tenant when tenantID is nil (the
// dashboard's global accounts). Besides the page it returns the key rows in page order, for
// callers that need more of each row, and the database time the holds were judged at.
func (r *reader) listKeys(ctx context.Context, tenantID *int64, f KeyFilter) (*KeyPage, []models.IdemKey, time.Time, error) {
	var fe []FieldError
	if f.Limit == 0 {
		f.Limit = DefaultListLimit
	}
	if f.Limit < 1 || f.Limit > MaxListLimit {
		fe = append(fe, FieldError{Field: "limit", Message: fmt.Sprintf("must be an integer from 1 to %d", MaxListLimit)})
	}
	if f.State != "" && !validState(f.State) {
		fe = append(fe, FieldError{Field: "state", Message: "must be one of in_progress, succeeded, failed, uncertain, released"})
	}
	if f.Operation != "" {
		if msg := ValidateOperationName(f.Operation); msg != "" {
			fe = append(fe, FieldError{Field: "operation", Message: msg})
		}
	}
	if f.KeyPrefix != "" && (len(f.KeyPrefix) > MaxKeyBytes || !utf8.ValidString(f.KeyPrefix)) {
		fe = append(fe, FieldError{Field: "prefix", Message: fmt.Sprintf("must be at most %d bytes of UTF-8", MaxKeyBytes)})
	}
	if _, _, err := decodeCursor(f.Cursor); err != nil {
		fe = append(fe, FieldError{Field: "cursor", Message: "is not a cursor returned by this endpoint"})
	}
	if _, _, err := decodeCursor(f.Before); err != nil {
		fe = append(fe, FieldError{Field: "before", Message: "is not a cursor returned by this endpoint"})
	} else if f.Before != "" && f.Cursor != "" {
		fe = append(fe, FieldError{Field: "before", Message: "cannot be combined with cursor"})
	}
	if len(fe) > 0 {
		return nil, nil, time.Time{}, invalid(fe...)
	}
	tx := r.db.WithContext(ctx)
	now, err := r.db.Now(ctx, tx)
	if err != nil {
		return nil, nil, time.Time{}, storeError("list keys", err)
	}
	var ks []models.IdemKey
	if err := keyPageQuery(tx, r.st, tenantID, f, now).Find(&ks).Error; err != nil {
		return nil, nil, time.Time{}, storeError("list keys", err)
	}
	page := &KeyPage{}
	more := len(ks) > f.Limit
	if more {
		ks = ks[:f.Limit]
	}
	if f.Before != "" {
		slices.Reverse(ks)
	}
	if len(ks) > 0 {
		first, last := ks[0], ks[len(ks)-1]
		// Forwards, more rows mean older keys; backwards, newer ones. The other direction has
		// rows whenever a cursor led here (at least the row the cursor was made from).
		if (f.Before == "" && more) || f.Before != "" {
			page.NextCursor = encodeCursor(last.AcquiredAt, last.ID)
		}
		if (f.Before != "" && more) || f.Cursor != "" {
			page.PrevCursor = encodeCursor(first.AcquiredAt, first.ID)
		}
	}
	page.Items, err = r.keyViews(tx, ks, now)
	if err != nil {
		return nil, nil, time.Time{}, storeError("list keys", err)
	}
	return page, ks, now, nil
}

func validState(s string) bool {
	switch s {
	case StateInProgress, StateSucceeded, StateFailed, StateUncertain, StateReleased:
		return true
	}
	return false
}

// keyViews loads the newest operation of each key with two queries for the whole page.
func (r *reader) keyViews(tx *gorm.DB, ks []models.IdemKey, now time.Time) ([]KeyView, error) {
	ids := make([]string, 0, len(ks))
	for _, k := range ks {
		ids = append(ids, k.LastOperationID)
	}
	ops := map[string]*models.Operation{}
	if len(ids) > 0 {
		var ms []models.Operation
		if err := tx.Where("id IN ?", ids).Find(&ms).Error; err != nil {
			return nil, err
		}
		for i := range ms {
			ops[ms[i].ID] = &ms[i]
		}
		if err := addCounters(tx, pointers(ms)...); err != nil {
			return nil, err
		}
	}
	out := make([]KeyView, 0, len(ks))
	for _, k := range ks {
		held := k.HolderOperationID != nil && k.ExpiresAt != nil && k.ExpiresAt.After(now)
		v := KeyView{Key: k.Key, Held: held, AcquiredAt: k.AcquiredAt.UTC()}
		if held {
			v.ExpiresAt = utcPtr(k.ExpiresAt)
		}
		if m, ok := ops[k.LastOperationID]; ok {
			op := operationFromModel(m, held && *k.HolderOperationID == m.ID)
			v.Operation = &op
		} else if tombstoned(&k, now) && *k.ProtectedBy == k.LastOperationID {
			// docs/reference.md §2 "Lifecycle": the newest operation was purged within its
			// horizon; its tombstone stands in. A tombstone of an older operation (a late
			// success) is not the key's newest operation, which is what a key view names.
			op := tombstoneOperation(&k)
			v.Operation = &op
		}
		out = append(out, v)
	}
	return out, nil
}

// AttemptFilter selects attempts for ListAttempts. Since, when set, keeps attempts at or after
// it. Cursor is an opaque value from a previous page.
type AttemptFilter struct {
	Key    string
	Result string
	Since  *time.Time
	Limit  int
	Cursor string
}

// AttemptPage is one page of attempts, newest first.
type AttemptPage struct {
	Items      []Attempt
	NextCursor string
}

// ListAttempts returns p's tenant's attempt log, newest first (docs/reference.md §4). Errors:
// ErrInvalidRequest, ErrStoreUnavailable.
func (rd *Reads) ListAttempts(ctx context.Context, tenantID int64, f AttemptFilter) (*AttemptPage, error) {
	var fe []FieldError
	if f.Limit == 0 {
		f.Limit = DefaultListLimit
	}
	if f.Limit < 1 || f.Limit > MaxListLimit {
		fe = append(fe, FieldError{Field: "limit", Message: fmt.Sprintf("must be an integer from 1 to %d", MaxListLimit)})
	}
	switch f.Result {
	case "", ResultAdmitted, ResultDuplicate, ResultConflict:
	default:
		fe = append(fe, FieldError{Field: "result", Message: "must be admitted, duplicate or conflict"})
	}
	if f.Key != "" {
		if msg := ValidateKey(f.Key); msg != "" {
			fe = append(fe, FieldError{Field: "key", Message: msg})
		}
	}
	var before int64
	if f.Cursor != "" {
		n, err := strconv.ParseInt(f.Cursor, 10, 64)
		if err != nil || n <= 0 {
			fe = append(fe, FieldError{Field: "cursor", Message: "is not a cursor returned by this endpoint"})
		}
		before = n
	}
	if len(fe) > 0 {
		return nil, invalid(fe...)
	}
	q := rd.db.WithContext(ctx).Where("tenant_id = ?", tenantID)
	if f.Key != "" {
		q = q.Where("key = ?", f.Key)
	}
	if f.Result != "" {
		q = q.Where("result = ?", f.Result)
	}
	if f.Since != nil {
		q = q.Where("attempted_at >= ?", f.Since.UTC())
	}
	if before > 0 {
		q = q.Where("id < ?", before)
	}
	var ms []models.Attempt
	if err := q.Order("id DESC").Limit(f.Limit + 1).Find(&ms).Error; err != nil {
		return nil, storeError("list attempts", err)
	}
	page := &AttemptPage{Items: []Attempt{}}
	if len(ms) > f.Limit {
		ms = ms[:f.Limit]
		page.NextCursor = strconv.FormatInt(ms[len(ms)-1].ID, 10)
	}
	for i := range ms {
		page.Items = append(page.Items, attemptFromModel(&ms[i]))
	}
	return page, nil
}

// keyFilterQuery is the keys list's FROM and WHERE for f (not its cursors) over one tenant, or
// every tenant when tenantID is nil; now is the database time "expiring soon" is judged at. It
// returns the query and the two columns, equal to idem_keys.acquired_at and idem_keys.id, that
// its order and cursors must use so the walk follows an index (docs/reference.md §4):
//   - no state filter, or state succeeded (most keys): idem_keys newest first along
//     idem_keys_tenant_acquired, the newest operation joined by primary key for the state and
//     operation filters; a filter most keys pass finds a page within a few dozen rows.
//   - any other state (rare at size: live holds, failed, uncertain, released): operations
//     newest first along operations_listed, a partial index of exactly those states, joined to
//     their key row. A key's newest operation is the one with the key's fencing token, and it
//     was admitted at the key's acquired_at, so (o.acquired_at, o.key_id) orders and pages
//     exactly like (idem_keys.acquired_at, idem_keys.id). The join compares fencing tokens
//     rather than operation ids on purpose: PostgreSQL estimates an id match as one row in
//     millions and then hash-joins every key; a token match it estimates as likely, and walks.
func keyFilterQuery(tx *gorm.DB, st store, tenantID *int64, f KeyFilter, now time.Time) (q *gorm.DB, atCol, idCol string) {
	// On PostgreSQL each join is a LATERAL subquery with OFFSET 0, which the planner cannot
	// flatten: it is run for each row of the walk, a probe of the other table's primary key.
	// A plain join left the planner free to hash both tables whenever the filter's rows were
	// near the statement's LIMIT, which the capped count's is (CountKeys): at 200,000 keys the
	// count of 10,121 released keys read every key and every operation, 163 ms, and a page
	// filtered by state took 6.5 times its time at 10,000 keys (make scale).
	if f.State != "" && f.State != StateSucceeded {
		q = tx.Table("operations AS o")
		q = q.Joins(st.probeJoin("idem_keys", "idem_keys", "idem_keys.id = o.key_id AND idem_keys.fencing_token = o.fencing_token"))
		q = q.Where("o.state = ?", f.State)
		if tenantID != nil {
			q = q.Where("o.tenant_id = ?", *tenantID)
		}
		atCol, idCol = "o.acquired_at", "o.key_id"
	} else {
		q = tx.Model(&models.IdemKey{})
		if tenantID != nil {
			q = q.Where("idem_keys.tenant_id = ?", *tenantID)
		}
		if f.State != "" || f.Operation != "" {
			q = q.Joins(st.probeJoin("operations", "o", "o.id = idem_keys.last_operation_id"))
			if f.State != "" {
				q = q.Where("o.state = ?", f.State)
			}
		}
		atCol, idCol = "idem_keys.acquired_at", "idem_keys.id"
	}
	if f.Operation != "" {
		q = q.Where("o.operation_name = ?", f.Operation)
	}
	if f.KeyPrefix != "" {
		// A range on the (tenant_id, key) index. Keys compare byte by byte on both databases
		// (PostgreSQL: COLLATE "C" in the baseline migration; SQLite: BINARY), and UTF-8's byte order
		// is code point order, so [prefix, prefixEnd(prefix)) holds exactly the keys that start
		// with prefix. Over every tenant, the range is read tenant by tenant: PostgreSQL is
		// given the tenants as an array, which it reads as one index scan over all their
		// ranges whatever the tables' statistics say; an IN (subquery) it may turn into a join
		// that reads every key when the tenants table looks large.
		if tenantID == nil {
			q = q.Where(st.inEveryTenant("idem_keys.tenant_id"))
		}
		q = q.Where("idem_keys.key >= ?", f.KeyPrefix)
		if end, ok := prefixEnd(f.KeyPrefix); ok {
			q = q.Where("idem_keys.key < ?", end)
		}
	}
	if f.ExpiringWithin > 0 {
		q = q.Where("idem_keys.holder_operation_id IS NOT NULL AND idem_keys.expires_at > ? AND idem_keys.expires_at <= ?",
			now, now.Add(f.ExpiringWithin))
	}
	return q, atCol, idCol
}

// keyPageQuery is the statement listKeys runs for f, cursors decoded: at most f.Limit+1 key
// rows in page order (ascending for f.Before, turned round by the caller). f has been
// validated. The plan tests EXPLAIN this very statement.
func keyPageQuery(tx *gorm.DB, st store, tenantID *int64, f KeyFilter, now time.Time) *gorm.DB {
	q, atCol, idCol := keyFilterQuery(tx, st, tenantID, f, now)
	if f.Cursor != "" {
		// A row comparison, not "a < x OR (a = x AND id < y)": PostgreSQL turns it into one index
		// range on (acquired_at DESC, id DESC). Measured at 1,000,000 keys, a page deep in the
		// list: 0.3 ms instead of 253 ms.
		at, id, _ := decodeCursor(f.Cursor)
		q = q.Where("("+atCol+", "+idCol+") < (?, ?)", at, id)
	}
	order := atCol + " DESC, " + idCol + " DESC"
	if f.Before != "" {
		// Backwards: the keys just newer than the cursor, read in ascending order along the
		// same index (walked the other way).
		at, id, _ := decodeCursor(f.Before)
		q = q.Where("("+atCol+", "+idCol+") > (?, ?)", at, id)
		order = atCol + ", " + idCol
	}
	return q.Select("idem_keys.*").Order(order).Limit(f.Limit + 1)
}

// prefixEnd returns the least string greater than every string that starts with p, in code
// point order: p with its last code point incremented, after dropping trailing U+10FFFF (which
// cannot be incremented) and stepping over the surrogates (which UTF-8 cannot hold). ok is
// false when p is empty or all U+10FFFF: then nothing bounds the range from above.
func prefixEnd(p string) (end string, ok bool) {
	rs := []rune(p)
	for i := len(rs) - 1; i >= 0; i-- {
		if rs[i] == unicode.MaxRune {
			continue
		}
		rs[i]++
		if rs[i] == 0xD800 {
			rs[i] = 0xE000
		}
		return string(rs[:i+1]), true
	}
	return "", false
}

// Cursors are opaque to clients: base64url of "<unix nanoseconds>.<row id>".
func encodeCursor(t time.Time, id int64) string {
	return base64.RawURLEncoding.EncodeToString([]byte(fmt.Sprintf("%d.%d", t.UnixNano(), id)))
}

func decodeCursor(c string) (time.Time, int64, error) {
	if c == "" {
		return time.Time{}, 0, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return time.Time{}, 0, err
	}
	ts, idStr, ok := strings.Cut(string(b), ".")
	if !ok {
		return time.Time{}, 0, errors.New("malformed cursor")
	}
	ns, err1 := strconv.ParseInt(ts, 10, 64)
	id, err2 := strconv.ParseInt(idStr, 10, 64)
	if err1 != nil || err2 != nil || id <= 0 {
		return time.Time{}, 0, errors.New("malformed cursor")
	}
	return time.Unix(0, ns).UTC(), id, nil
}
