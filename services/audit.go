package services

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"strings"
	"time"

	"github.com/idemgate/idemgate/models"
)

// Audit limits (docs/reference.md §5 "Audit").
const (
	// DefaultAuditSpan is the time range audited when the filter gives none.
	DefaultAuditSpan = 24 * time.Hour
	// MaxAuditSpan bounds the range so one request cannot scan the whole attempt log.
	MaxAuditSpan = 31 * 24 * time.Hour
	// MaxAuditGroups caps the grouped report; AuditReport.Truncated says when more matched.
	// The CSV export (Attempts) has no cap.
	MaxAuditGroups = 500
)

// AuditFilter selects the attempts audited: those at or after From and before To. A zero To
// means the database's now; a zero From means DefaultAuditSpan before To. Tenant, when not
// empty, keeps only the tenant of that name (for global accounts; a restricted account
// naming another tenant gets an empty report).
type AuditFilter struct {
	From   time.Time
	To     time.Time
	Tenant string
}

// AuditGroup is one audited (tenant, key): its duplicate and conflicting attempts in the
// range, and its admissions in the range that were a possible duplicate effect. FirstAt and
// LastAt are the first and last duplicate or conflicting attempt, UTC; for a key audited only
// for a possible duplicate effect, the first and last such admission.
//
// PossibleDuplicateEffect is set when an operation of the key was admitted while an earlier
// operation of it (a lower fencing token) had succeeded or was uncertain, so the destination
// may have seen the effect twice. The earlier operation is judged by its state now: one
// reconciled as failed had no effect, so it flags nothing; one reconciled as succeeded still
// does. It is judged over the key's whole stored history, not only the range, and cannot see
// operations retention has purged.
//
// OperationID is the operation the row links to: the newest possible duplicate effect when
// flagged, otherwise the operation the group's last attempt was answered about.
type AuditGroup struct {
	TenantID                int64
	TenantName              string
	Key                     string
	Duplicates              int64
	Conflicts               int64
	FirstAt                 time.Time
	LastAt                  time.Time
	PossibleDuplicateEffect bool
	OperationID             string
}

// Audit reviews duplicate attempts for auditors (the dashboard's Audit page and its CSV
// export): which keys were asked for more than once, and which admissions may have duplicated
// an effect. Safe for concurrent use.
type Audit struct {
	reader
}

// NewAudit returns an Audit over db.
func NewAudit(db *models.DB) *Audit { return &Audit{reader{db: db, st: newStore(db)}} }

// possibleDuplicateEffectOf is the SQL condition "operation <op> was admitted while an earlier
// operation of its key was in a state that may duplicate its effect" (mayDuplicateEffect;
// AuditGroup.PossibleDuplicateEffect), for an operation id column op. The unique index on
// (key_id, fencing_token) serves the lookup.
func possibleDuplicateEffectOf(op string) string {
	return `EXISTS (SELECT 1 FROM operations pl JOIN operations pe
	  ON pe.key_id = pl.key_id AND pe.fencing_token < pl.fencing_token
	  WHERE pl.id = ` + op + ` AND pe.state IN ('` + strings.Join(duplicateEffectStates, "', '") + `'))`
}

// AuditReport is the Audit page: the resolved filter and the groups, most recent last attempt
// first. Truncated is true when more than MaxAuditGroups groups matched and only the first
// MaxAuditGroups are in Groups.
type AuditReport struct {
	Filter    AuditFilter
	Groups    []AuditGroup
	Truncated bool
}

// AuditRow is one audited attempt, for the CSV export: a duplicate or conflicting attempt, or
// the admission of an operation that was a possible duplicate effect (see AuditGroup).
// PossibleDuplicateEffect is set when the attempt's operation is one. Optional fields are ""
// when the attempt did not carry them.
type AuditRow struct {
	TenantName    string
	Key           string
	AttemptedAt   time.Time
	Result        string
	OperationID   string
	AttemptID     string
	Caller        string
	Fingerprint   string
	CorrelationID string

	PossibleDuplicateEffect bool
}

// ResolveFilter fills in f's defaults from the database clock and validates it: To must
// be after From and the span at most MaxAuditSpan. Times come back in UTC. Resolving a
// resolved filter changes nothing, so callers may resolve first (to report a bad range before
// streaming) and pass the result on. Errors: ErrInvalidRequest (fields "from", "to"),
// ErrStoreUnavailable.
func (au *Audit) ResolveFilter(ctx context.Context, f AuditFilter) (AuditFilter, error) {
	if f.To.IsZero() {
		now, err := au.db.Now(ctx, au.db.WithContext(ctx))
		if err != nil {
			return f, storeError("audit", err)
		}
		f.To = now
	}
	if f.From.IsZero() {
		f.From = f.To.Add(-DefaultAuditSpan)
	}
	f.From, f.To = f.From.UTC(), f.To.UTC()
	if !f.To.After(f.From) {
		return f, invalid(FieldError{Field: "to", Message: "must be after from"})
	}
	if f.To.Sub(f.From) > MaxAuditSpan {
		return f, invalid(FieldError{Field: "from", Message: fmt.Sprintf("must be at most %d days before to", int(MaxAuditSpan/(24*time.Hour)))})
	}
	return f, nil
}

// auditScope resolves the tenant to audit: tenantID (the account's restriction) narrowed by
// the filter's tenant name. ok is false when nothing can match (an unknown tenant name, or
// another tenant than the account's), which answers an empty report without saying which.
func (au *Audit) auditScope(ctx context.Context, tenantID *int64, name string) (scope *int64, ok bool, err error) {
	if name == "" {
		return tenantID, true, nil
	}
	var ts []models.Tenant
	if err := au.db.WithContext(ctx).Where("name = ?", name).Limit(1).Find(&ts).Error; err != nil {
		return nil, false, err
	}
	if len(ts) == 0 || (tenantID != nil && *tenantID != ts[0].ID) {
		return nil, false, nil
	}
	return &ts[0].ID, true, nil
}

// Report reports the duplicate and conflicting attempts in f's range, and the admissions in it
// that were a possible duplicate effect, grouped by (tenant, key), for one tenant or every
// tenant when tenantID is nil (docs/reference.md §5 "Audit"). At most
// MaxAuditGroups groups, most recent last attempt first. Errors: ErrInvalidRequest (bad
// range, see ResolveFilter), ErrStoreUnavailable.
func (au *Audit) Report(ctx context.Context, tenantID *int64, f AuditFilter) (*AuditReport, error) {
	f, err := au.ResolveFilter(ctx, f)
	if err != nil {
		return nil, err
	}
	rep := &AuditReport{Filter: f, Groups: []AuditGroup{}}
	scope, ok, err := au.auditScope(ctx, tenantID, f.Tenant)
	if err != nil {
		return nil, storeError("audit", err)
	} else if !ok {
		return rep, nil
	}
	tx := au.db.WithContext(ctx)
	// Like the Overview, this scans the range's attempts without an attempted_at index.
	// Admissions are few per key but many in all: each is checked with index lookups only.
	q := tx.Table("attempts a").
		Select("tenant_id, key, "+
			"SUM(CASE WHEN result = ? THEN 1 ELSE 0 END) AS duplicates, "+
			"SUM(CASE WHEN result = ? THEN 1 ELSE 0 END) AS conflicts, "+
			"MIN(CASE WHEN result <> ? THEN attempted_at END) AS first_at, "+
			"MAX(CASE WHEN result <> ? THEN attempted_at END) AS last_at, "+
			"MIN(attempted_at) AS first_any, MAX(attempted_at) AS last_any, MAX(id) AS last_id",
			ResultDuplicate, ResultConflict, ResultAdmitted, ResultAdmitted).
		Where("(result IN ? OR (result = ? AND "+possibleDuplicateEffectOf("a.operation_id")+"))",
			[]string{ResultDuplicate, ResultConflict}, ResultAdmitted).
		Where("attempted_at >= ? AND attempted_at < ?", f.From, f.To).
		Group("tenant_id, key").
		Order("last_any DESC, tenant_id, key").
		Limit(MaxAuditGroups + 1)
	if scope != nil {
		q = q.Where("tenant_id = ?", *scope)
	}
	var rows []struct {
		TenantID   int64
		Key        string
		Duplicates int64
		Conflicts  int64
		FirstAt    dbTime
		LastAt     dbTime
		FirstAny   dbTime
		LastAny    dbTime
		LastID     int64
	}
	if err := q.Scan(&rows).Error; err != nil {
		return nil, storeError("audit", err)
	}
	if len(rows) > MaxAuditGroups {
		rows, rep.Truncated = rows[:MaxAuditGroups], true
	}
	if len(rows) == 0 {
		return rep, nil
	}
	tenantIDs, keys, lastIDs := []int64{}, []string{}, []int64{}
	seenT, seenK := map[int64]bool{}, map[string]bool{}
	for _, r := range rows {
		lastIDs = append(lastIDs, r.LastID)
		if !seenT[r.TenantID] {
			seenT[r.TenantID] = true
			tenantIDs = append(tenantIDs, r.TenantID)
		}
		if !seenK[r.Key] {
			seenK[r.Key] = true
			keys = append(keys, r.Key)
		}
	}
	var ts []models.Tenant
	if err := tx.Where("id IN ?", tenantIDs).Find(&ts).Error; err != nil {
		return nil, storeError("audit", err)
	}
	names := map[int64]string{}
	for _, t := range ts {
		names[t.ID] = t.Name
	}
	// The flag rule of AuditGroup, for the whole page in one query. IN over tenants × keys may
	// match pairs not on the page; those are simply not looked up.
	var flagged []struct {
		TenantID     int64
		Key          string
		ID           string
		FencingToken int64
	}
	if err := tx.Raw(`SELECT o.tenant_id, o.key, o.id, o.fencing_token FROM idem_keys k
		JOIN operations o ON o.key_id = k.id
		WHERE k.tenant_id IN ? AND k.key IN ? AND `+possibleDuplicateEffectOf("o.id"), tenantIDs, keys).
		Scan(&flagged).Error; err != nil {
		return nil, storeError("audit", err)
	}
	type tk struct {
		t int64
		k string
	}
	newestFlagged, newestToken := map[tk]string{}, map[tk]int64{}
	for _, f := range flagged {
		if k := (tk{f.TenantID, f.Key}); f.FencingToken > newestToken[k] {
			newestFlagged[k], newestToken[k] = f.ID, f.FencingToken
		}
	}
	var last []models.Attempt
	if err := tx.Select("id", "operation_id").Where("id IN ?", lastIDs).Find(&last).Error; err != nil {
		return nil, storeError("audit", err)
	}
	lastOp := map[int64]string{}
	for _, at := range last {
		lastOp[at.ID] = deref(at.OperationID)
	}
	for _, r := range rows {
		g := AuditGroup{
			TenantID: r.TenantID, TenantName: names[r.TenantID], Key: r.Key,
			Duplicates: r.Duplicates, Conflicts: r.Conflicts, FirstAt: r.FirstAt.T, LastAt: r.LastAt.T,
			OperationID: lastOp[r.LastID],
		}
		if g.FirstAt.IsZero() { // audited only for its admissions
			g.FirstAt, g.LastAt = r.FirstAny.T, r.LastAny.T
		}
		if id, ok := newestFlagged[tk{r.TenantID, r.Key}]; ok {
			g.PossibleDuplicateEffect, g.OperationID = true, id
		}
		rep.Groups = append(rep.Groups, g)
	}
	return rep, nil
}

// AuditExportBatch is how many rows Attempts reads with one query.
const AuditExportBatch = 500

// Attempts calls fn with every audited attempt in f's range (see AuditRow: duplicates,
// conflicts, and admissions that were a possible duplicate effect), in the order they were
// logged (attempt id; oldest first, up to attempts logged concurrently), for one tenant or
// every tenant when tenantID is nil. Rows are read AuditExportBatch at a time, each batch by
// its own short query bounded by batchTimeout (0: only ctx bounds it), and fn sees a batch's
// rows only after its connection went back to the pool: fn may block on a slow client for as
// long as it likes without holding a database connection, so slow downloads cannot starve
// admission, and an export of any size runs in constant memory. Attempts logged while the
// export runs may or may not be in it. An error from fn stops the export and is returned as
// is. Errors: ErrInvalidRequest (bad range), ErrStoreUnavailable.
func (au *Audit) Attempts(ctx context.Context, tenantID *int64, f AuditFilter, batchTimeout time.Duration, fn func(AuditRow) error) error {
	f, err := au.ResolveFilter(ctx, f)
	if err != nil {
		return err
	}
	sctx, cancel := withTimeout(ctx, batchTimeout)
	scope, ok, err := au.auditScope(sctx, tenantID, f.Tenant)
	cancel()
	if err != nil {
		return storeError("audit export", err)
	} else if !ok {
		return nil
	}
	var after int64
	for {
		batch, last, err := au.auditAttemptsBatch(ctx, batchTimeout, scope, f, after)
		if err != nil {
			return storeError("audit export", err)
		}
		for _, r := range batch {
			if err := fn(r); err != nil {
				return err
			}
		}
		if len(batch) < AuditExportBatch {
			return nil
		}
		after = last
	}
}

// auditAttemptsBatch reads the next AuditExportBatch attempts of the export with an id above
// after, and returns them with the last one's id. Keyset paging on the primary key: each batch
// continues the index walk where the previous one stopped, so the export reads the table once.
func (au *Audit) auditAttemptsBatch(ctx context.Context, timeout time.Duration, scope *int64, f AuditFilter, after int64) ([]AuditRow, int64, error) {
	ctx, cancel := withTimeout(ctx, timeout)
	defer cancel()
	q := au.db.WithContext(ctx).Table("attempts a").
		Select("a.id, t.name, a.key, a.attempted_at, a.result, a.operation_id, a.attempt_id, a.caller, a.fingerprint, a.correlation_id, "+
			"CASE WHEN "+possibleDuplicateEffectOf("a.operation_id")+" THEN 1 ELSE 0 END AS pde").
		Joins("JOIN tenants t ON t.id = a.tenant_id").
		Where("a.id > ?", after).
		Where("(a.result IN ? OR (a.result = ? AND "+possibleDuplicateEffectOf("a.operation_id")+"))",
			[]string{ResultDuplicate, ResultConflict}, ResultAdmitted).
		Where("a.attempted_at >= ? AND a.attempted_at < ?", f.From, f.To).
		Order("a.id").
		Limit(AuditExportBatch)
	if scope != nil {
		q = q.Where("a.tenant_id = ?", *scope)
	}
	rows, err := q.Rows()
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	out := make([]AuditRow, 0, AuditExportBatch)
	var last int64
	for rows.Next() {
		var (
			r                     AuditRow
			at                    dbTime
			opID, attID, fp, corr sql.NullString
			pde                   int64
		)
		if err := rows.Scan(&last, &r.TenantName, &r.Key, &at, &r.Result, &opID, &attID, &r.Caller, &fp, &corr, &pde); err != nil {
			return nil, 0, err
		}
		r.PossibleDuplicateEffect = pde == 1
		r.AttemptedAt, r.OperationID, r.AttemptID, r.Fingerprint, r.CorrelationID = at.T, opID.String, attID.String, fp.String, corr.String
		out = append(out, r)
	}
	return out, last, rows.Err()
}

// withTimeout is ctx with a deadline d from now, or ctx itself when d is 0.
func withTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, d)
}

// dbTime scans a timestamp from either dialect: PostgreSQL and SQLite's typed columns give a
// time.Time, but SQLite gives an aggregate such as MIN(attempted_at) back as the stored text.
type dbTime struct{ T time.Time }

// sqliteTimeLayouts are the text forms SQLite drivers store times in.
var sqliteTimeLayouts = []string{
	"2006-01-02 15:04:05.999999999-07:00",
	"2006-01-02T15:04:05.999999999-07:00",
	"2006-01-02 15:04:05.999999999",
	"2006-01-02T15:04:05.999999999",
	time.RFC3339Nano,
}

// Value implements driver.Valuer; GORM requires it before it scans into a struct-typed field.
func (d dbTime) Value() (driver.Value, error) { return d.T, nil }

// Scan implements sql.Scanner.
func (d *dbTime) Scan(v any) error {
	switch x := v.(type) {
	case time.Time:
		d.T = x.UTC()
		return nil
	case string:
		return d.parse(x)
	case []byte:
		return d.parse(string(x))
	case nil:
		d.T = time.Time{}
		return nil
	}
	return fmt.Errorf("cannot scan %T as a time", v)
}

func (d *dbTime) parse(s string) error {
	for _, l := range sqliteTimeLayouts {
		if t, err := time.Parse(l, s); err == nil {
			d.T = t.UTC()
			return nil
		}
	}
	return fmt.Errorf("cannot parse time %q", s)
}
