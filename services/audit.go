package services

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/idemgate/idemgate/models"
	"gorm.io/gorm"
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
	// FlaggedOnly keeps, in Report, only the groups with a possible duplicate effect admitted
	// in the range (the page's "possible duplicate effects only"); the export ignores it.
	FlaggedOnly bool
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

// AuditScanCap bounds the audited attempts (and, separately, the flagged admissions) one Audit
// page walks, newest first, looking for the page's keys: the page's cost is bounded whatever
// the range holds, even when a few keys hold all of its duplicates. A walk that stops there
// makes the report Truncated. The CSV export (Attempts) has no cap.
const AuditScanCap = 20000

// auditWalkBatch is how many rows one statement of the Audit page's walks reads: enough that
// a range with many keys fills the page in one or two, few enough that a range of a few keys
// does not read far past them.
const auditWalkBatch = 1000

// Report reports the duplicate and conflicting attempts in f's range, and the admissions in it
// that were a possible duplicate effect, grouped by (tenant, key), for one tenant or every
// tenant when tenantID is nil (docs/reference.md §5 "Audit"). At most MaxAuditGroups groups,
// most recent last attempt first; with f.FlaggedOnly, only groups with a possible duplicate
// effect admitted in the range. Errors: ErrInvalidRequest (bad range, see ResolveFilter),
// ErrStoreUnavailable.
//
// It walks the range's duplicate or conflicting attempts newest first along attempts_audited,
// and its flagged admissions along operations_flagged (an index of the baseline migration), each until it has seen
// MaxAuditGroups+1 keys (or AuditScanCap rows), then reads the page's keys' counts: a bounded
// number of rows at any size. Before, it grouped every attempt of the range and evaluated the
// possible-duplicate rule for each admission, which answered 503 at a million keys.
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
	type tk struct {
		t int64
		k string
	}
	type group struct {
		AuditGroup
		lastAny           time.Time // the newest audited attempt or flagged admission seen
		lastID            int64     // the newest duplicate or conflicting attempt's id
		admFirst, admLast time.Time // the flagged admissions in the range
	}
	groups := map[tk]*group{}

	// The page shows the MaxAuditGroups keys audited most recently, so the two walks below go
	// newest first and stop as soon as they have seen one key more than that: at size a few
	// hundred rows, however many the range holds. They used to read the range's newest
	// AuditScanCap rows each and group them all, which grew with the data until the cap (31
	// days at 200,000 keys: 11,000 rows, 77 ms, 5.5 times the figure at 10,000 keys). The
	// page's counts are then read for its keys alone (below), so they are exact over the
	// range, not over what a walk happened to read. AuditScanCap still bounds each walk: a
	// storm of duplicates on a few keys stops it there, and the report says it is truncated.
	var scanned int64
	if !f.FlaggedOnly {
		var after *exportCursor
		for scanned < AuditScanCap && len(groups) <= MaxAuditGroups {
			q := tx.Table("attempts").Select("id, tenant_id, key, attempted_at").
				Where("result <> ? AND attempted_at >= ? AND attempted_at < ?", ResultAdmitted, f.From, f.To)
			if scope != nil {
				q = q.Where("tenant_id = ?", *scope)
			}
			if after != nil {
				// A row comparison: one range of attempts_audited (attempted_at, id), walked down.
				q = q.Where("(attempted_at, id) < (?, ?)", after.at, after.seq)
			}
			var rows []struct {
				ID          int64
				TenantID    int64
				Key         string
				AttemptedAt dbTime
			}
			if err := q.Order("attempted_at DESC, id DESC").Limit(auditWalkBatch).Scan(&rows).Error; err != nil {
				return nil, storeError("audit", err)
			}
			for _, r := range rows {
				scanned++
				if _, ok := groups[tk{r.TenantID, r.Key}]; !ok {
					groups[tk{r.TenantID, r.Key}] = &group{
						AuditGroup: AuditGroup{TenantID: r.TenantID, Key: r.Key},
						lastAny:    r.AttemptedAt.T, lastID: r.ID,
					}
				}
			}
			if len(rows) < auditWalkBatch {
				break
			}
			last := rows[len(rows)-1]
			after = &exportCursor{at: last.AttemptedAt.T, seq: last.ID}
		}
		rep.Truncated = scanned >= AuditScanCap
	}

	flaggedKeys := map[tk]bool{}
	var flaggedScanned int
	var afterOp *exportCursor
	for flaggedScanned < AuditScanCap && len(flaggedKeys) <= MaxAuditGroups {
		fq := tx.Table("operations").Select("id, tenant_id, key, acquired_at").
			Where("possible_duplicate_effect AND acquired_at >= ? AND acquired_at < ?", f.From, f.To)
		if scope != nil {
			fq = fq.Where("tenant_id = ?", *scope)
		}
		if afterOp != nil {
			fq = fq.Where("(acquired_at, id) < (?, ?)", afterOp.at, afterOp.id)
		}
		var flaggedIn []struct {
			ID         string
			TenantID   int64
			Key        string
			AcquiredAt dbTime
		}
		if err := fq.Order("acquired_at DESC, id DESC").Limit(auditWalkBatch).Scan(&flaggedIn).Error; err != nil {
			return nil, storeError("audit", err)
		}
		for _, fl := range flaggedIn {
			flaggedScanned++
			k := tk{fl.TenantID, fl.Key}
			flaggedKeys[k] = true
			g, ok := groups[k]
			if !ok {
				// Audited only for its admissions: its times are theirs (until the counts below
				// find duplicates of it in the range).
				g = &group{AuditGroup: AuditGroup{TenantID: k.t, Key: k.k}}
				groups[k] = g
			}
			if g.admFirst.IsZero() || fl.AcquiredAt.T.Before(g.admFirst) {
				g.admFirst = fl.AcquiredAt.T
			}
			g.admLast = maxTime(g.admLast, fl.AcquiredAt.T)
			g.lastAny = maxTime(g.lastAny, fl.AcquiredAt.T)
		}
		if len(flaggedIn) < auditWalkBatch {
			break
		}
		last := flaggedIn[len(flaggedIn)-1]
		afterOp = &exportCursor{at: last.AcquiredAt.T, id: last.ID}
	}
	if flaggedScanned >= AuditScanCap {
		rep.Truncated = true
	}
	page := make([]*group, 0, len(groups))
	for k, g := range groups {
		if f.FlaggedOnly && !flaggedKeys[k] {
			continue
		}
		page = append(page, g)
	}
	byLast := func(a, b *group) int {
		if c := b.lastAny.Compare(a.lastAny); c != 0 {
			return c
		}
		if a.TenantID != b.TenantID {
			return cmp.Compare(a.TenantID, b.TenantID)
		}
		return strings.Compare(a.Key, b.Key)
	}
	slices.SortFunc(page, byLast)
	if len(page) > MaxAuditGroups {
		page, rep.Truncated = page[:MaxAuditGroups], true
	}
	if len(page) == 0 {
		return rep, nil
	}

	tenantIDs, keys := []int64{}, []string{}
	seenT, seenK := map[int64]bool{}, map[string]bool{}
	for _, g := range page {
		if !seenT[g.TenantID] {
			seenT[g.TenantID] = true
			tenantIDs = append(tenantIDs, g.TenantID)
		}
		if !seenK[g.Key] {
			seenK[g.Key] = true
			keys = append(keys, g.Key)
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
	// The flag of AuditGroup is over the key's whole stored history, not only the range: one
	// query for the page, along the keys' unique index and operations_key_generation. IN over
	// tenants × keys may match pairs not on the page; those are simply not looked up.
	var flagged []struct {
		TenantID     int64
		Key          string
		ID           string
		FencingToken int64
	}
	if err := tx.Raw(`SELECT o.tenant_id, o.key, o.id, o.fencing_token FROM idem_keys k
		JOIN operations o ON o.key_id = k.id
		WHERE k.tenant_id IN ? AND k.key IN ? AND o.possible_duplicate_effect`, tenantIDs, keys).
		Scan(&flagged).Error; err != nil {
		return nil, storeError("audit", err)
	}
	newestFlagged, newestToken := map[tk]string{}, map[tk]int64{}
	for _, fl := range flagged {
		if k := (tk{fl.TenantID, fl.Key}); fl.FencingToken > newestToken[k] {
			newestFlagged[k], newestToken[k] = fl.ID, fl.FencingToken
		}
	}
	// The page's counts: every duplicate and conflicting attempt of its keys in the range, found
	// through the keys' operations (operations_key_generation, then attempts_operation): every
	// such attempt names the operation it was answered about. A key whose attempts name no
	// stored operation keeps what the walk saw of it.
	var counts []struct {
		TenantID   int64
		Key        string
		Duplicates int64
		Conflicts  int64
		FirstAt    dbTime
		LastAt     dbTime
		LastID     int64
	}
	if err := tx.Raw(`SELECT k.tenant_id, k.key,
  SUM(CASE WHEN a.result = ? THEN 1 ELSE 0 END) AS duplicates,
  SUM(CASE WHEN a.result = ? THEN 1 ELSE 0 END) AS conflicts,
  MIN(a.attempted_at) AS first_at, MAX(a.attempted_at) AS last_at, MAX(a.id) AS last_id
FROM idem_keys k JOIN operations o ON o.key_id = k.id JOIN attempts a ON a.operation_id = o.id
WHERE k.tenant_id IN ? AND k.key IN ? AND a.result <> ? AND a.attempted_at >= ? AND a.attempted_at < ?
GROUP BY k.tenant_id, k.key`, ResultDuplicate, ResultConflict, tenantIDs, keys, ResultAdmitted, f.From, f.To).
		Scan(&counts).Error; err != nil {
		return nil, storeError("audit", err)
	}
	onPage := map[tk]*group{}
	for _, g := range page {
		onPage[tk{g.TenantID, g.Key}] = g
	}
	for _, c := range counts {
		g, ok := onPage[tk{c.TenantID, c.Key}]
		if !ok {
			continue // a pair of the IN lists that is not on the page
		}
		g.Duplicates, g.Conflicts, g.FirstAt, g.LastAt = c.Duplicates, c.Conflicts, c.FirstAt.T, c.LastAt.T
		if c.LastID > g.lastID {
			g.lastID = c.LastID
		}
		g.lastAny = maxTime(g.lastAny, c.LastAt.T)
	}
	lastIDs := []int64{}
	for _, g := range page {
		if g.Duplicates+g.Conflicts == 0 {
			// Audited only for its admissions: its times are theirs.
			g.FirstAt, g.LastAt = g.admFirst, g.admLast
		}
		if g.lastID != 0 {
			lastIDs = append(lastIDs, g.lastID)
		}
	}
	// With only flagged admissions walked, a key's duplicates can be newer than its admission.
	slices.SortFunc(page, byLast)
	lastOp := map[int64]string{}
	if len(lastIDs) > 0 {
		var last []models.Attempt
		if err := tx.Select("id", "operation_id").Where("id IN ?", lastIDs).Find(&last).Error; err != nil {
			return nil, storeError("audit", err)
		}
		for _, at := range last {
			lastOp[at.ID] = deref(at.OperationID)
		}
	}
	for _, g := range page {
		g.TenantName, g.OperationID = names[g.TenantID], lastOp[g.lastID]
		if id, ok := newestFlagged[tk{g.TenantID, g.Key}]; ok {
			g.PossibleDuplicateEffect, g.OperationID = true, id
		}
		rep.Groups = append(rep.Groups, g.AuditGroup)
	}
	return rep, nil
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// AuditExportBatch is how many rows Attempts reads with one query, from each of its two
// sources.
const AuditExportBatch = 2000

// Attempts calls fn with every audited attempt in f's range (see AuditRow): the duplicate and
// conflicting attempts made in the range, and the admitted attempts of the operations admitted
// in the range that were a possible duplicate effect (an attempt_id retry of such an admission
// is listed with it, whenever it came). Rows come oldest first: the two sources, each read in
// time order along its index (attempts_audited, operations_flagged), are merged by time. The
// export is for one tenant or every tenant when tenantID is nil. Rows are read
// AuditExportBatch at a time, each batch by its own short query bounded by batchTimeout (0:
// only ctx bounds it), and fn sees a batch's rows only after its connection went back to the
// pool: fn may block on a slow client for as long as it likes without holding a database
// connection, so slow downloads cannot starve admission, and an export of any size runs in
// constant memory. Attempts logged while the export runs may or may not be in it. An error
// from fn stops the export and is returned as is. Errors: ErrInvalidRequest (bad range),
// ErrStoreUnavailable.
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
	dups := &exportSource{next: func(after exportCursor) ([]exportRow, error) {
		return au.exportDuplicates(ctx, batchTimeout, scope, f, after)
	}}
	adms := &exportSource{next: func(after exportCursor) ([]exportRow, error) {
		return au.exportFlaggedAdmissions(ctx, batchTimeout, scope, f, after)
	}}
	for {
		for _, s := range []*exportSource{dups, adms} {
			if err := s.fill(); err != nil {
				return storeError("audit export", err)
			}
		}
		if len(dups.buf) == 0 && len(adms.buf) == 0 {
			return nil
		}
		// Emit while both sources have rows buffered (or one is exhausted): each emitted row
		// is then the oldest not yet emitted.
		for (len(dups.buf) > 0 || dups.done) && (len(adms.buf) > 0 || adms.done) {
			var r exportRow
			switch {
			case len(dups.buf) == 0 && len(adms.buf) == 0:
				return nil
			case len(adms.buf) == 0 || (len(dups.buf) > 0 && !adms.buf[0].cur.before(dups.buf[0].cur)):
				r, dups.buf = dups.buf[0], dups.buf[1:]
			default:
				r, adms.buf = adms.buf[0], adms.buf[1:]
			}
			if err := fn(r.row); err != nil {
				return err
			}
		}
	}
}

// exportCursor is the keyset position of an export source: its sort time, then the row's ids.
type exportCursor struct {
	at  time.Time
	id  string // the operation id, for flagged admissions ("" for duplicates)
	seq int64  // the attempt id
}

func (c exportCursor) before(d exportCursor) bool {
	if !c.at.Equal(d.at) {
		return c.at.Before(d.at)
	}
	if c.id != d.id {
		return c.id < d.id
	}
	return c.seq < d.seq
}

type exportRow struct {
	row AuditRow
	cur exportCursor
}

// exportSource is one of the export's two ordered streams: a buffer refilled a batch at a time
// from where the last batch ended.
type exportSource struct {
	next  func(after exportCursor) ([]exportRow, error)
	buf   []exportRow
	after exportCursor
	done  bool
}

func (s *exportSource) fill() error {
	if len(s.buf) > 0 || s.done {
		return nil
	}
	rows, err := s.next(s.after)
	if err != nil {
		return err
	}
	s.buf = rows
	if len(rows) < AuditExportBatch {
		s.done = true
	}
	if len(rows) > 0 {
		s.after = rows[len(rows)-1].cur
	}
	return nil
}

// exportDuplicates reads the next AuditExportBatch duplicate or conflicting attempts of the
// range after the cursor, along attempts_audited (attempted_at, id).
func (au *Audit) exportDuplicates(ctx context.Context, timeout time.Duration, scope *int64, f AuditFilter, after exportCursor) ([]exportRow, error) {
	ctx, cancel := withTimeout(ctx, timeout)
	defer cancel()
	q := au.db.WithContext(ctx).Table("attempts a").
		Select("a.id, t.name, a.key, a.attempted_at, a.result, a.operation_id, a.attempt_id, a.caller, a.fingerprint, a.correlation_id, "+
			"CASE WHEN o.possible_duplicate_effect THEN 1 ELSE 0 END AS pde").
		Joins("JOIN tenants t ON t.id = a.tenant_id").
		Joins("LEFT JOIN operations o ON o.id = a.operation_id").
		Where("a.result <> ? AND a.attempted_at >= ? AND a.attempted_at < ?", ResultAdmitted, f.From, f.To)
	if !after.at.IsZero() {
		q = q.Where("a.attempted_at >= ? AND (a.attempted_at > ? OR a.id > ?)", after.at, after.at, after.seq)
	}
	if scope != nil {
		q = q.Where("a.tenant_id = ?", *scope)
	}
	return scanExportRows(q.Order("a.attempted_at, a.id").Limit(AuditExportBatch), false)
}

// exportFlaggedAdmissions reads the next AuditExportBatch admitted attempts of flagged
// operations admitted in the range after the cursor, along operations_flagged (acquired_at),
// then each operation's attempts (attempts_operation).
func (au *Audit) exportFlaggedAdmissions(ctx context.Context, timeout time.Duration, scope *int64, f AuditFilter, after exportCursor) ([]exportRow, error) {
	ctx, cancel := withTimeout(ctx, timeout)
	defer cancel()
	q := au.db.WithContext(ctx).Table("operations o").
		Select("a.id, t.name, a.key, a.attempted_at, a.result, a.operation_id, a.attempt_id, a.caller, a.fingerprint, a.correlation_id, "+
			"1 AS pde, o.acquired_at, o.id").
		Joins("JOIN attempts a ON a.operation_id = o.id AND a.result = ?", ResultAdmitted).
		Joins("JOIN tenants t ON t.id = o.tenant_id").
		Where("o.possible_duplicate_effect AND o.acquired_at >= ? AND o.acquired_at < ?", f.From, f.To)
	if !after.at.IsZero() {
		q = q.Where("o.acquired_at >= ? AND (o.acquired_at > ? OR o.id > ? OR (o.id = ? AND a.id > ?))",
			after.at, after.at, after.id, after.id, after.seq)
	}
	if scope != nil {
		q = q.Where("o.tenant_id = ?", *scope)
	}
	return scanExportRows(q.Order("o.acquired_at, o.id, a.id").Limit(AuditExportBatch), true)
}

// scanExportRows runs q and reads its rows; withOp says the query also returns the
// operation's acquired_at and id, the flagged source's cursor.
func scanExportRows(q *gorm.DB, withOp bool) ([]exportRow, error) {
	rows, err := q.Rows()
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make([]exportRow, 0, AuditExportBatch)
	for rows.Next() {
		var (
			r                     AuditRow
			id                    int64
			at, opAt              dbTime
			opID, attID, fp, corr sql.NullString
			pde                   int64
			curOp                 string
		)
		dest := []any{&id, &r.TenantName, &r.Key, &at, &r.Result, &opID, &attID, &r.Caller, &fp, &corr, &pde}
		if withOp {
			dest = append(dest, &opAt, &curOp)
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		r.PossibleDuplicateEffect = pde == 1
		r.AttemptedAt, r.OperationID, r.AttemptID, r.Fingerprint, r.CorrelationID = at.T, opID.String, attID.String, fp.String, corr.String
		cur := exportCursor{at: at.T, seq: id}
		if withOp {
			cur = exportCursor{at: opAt.T, id: curOp, seq: id}
		}
		out = append(out, exportRow{row: r, cur: cur})
	}
	return out, rows.Err()
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
