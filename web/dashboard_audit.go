package web

import (
	"bufio"
	"cmp"
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"github.com/dustin/go-humanize"
	"io"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/idemgate/idemgate/services"
	"github.com/idemgate/idemgate/views"
	"github.com/idemgate/idemgate/web/logging"
)

// auditTimeLayouts are the accepted spellings of the from and to parameters: what a
// datetime-local input sends (interpreted as UTC), and RFC 3339 for hand-written links.
var auditTimeLayouts = []string{"2006-01-02T15:04", "2006-01-02T15:04:05", time.RFC3339}

// auditInputLayout is the datetime-local value format the filter form shows.
const auditInputLayout = "2006-01-02T15:04"

// An export has no bound on its total time: a large range can take longer than any fixed
// limit to download, and a cut-off file would silently lack rows. What bounds it is progress:
// each write to the client pushes the connection's write deadline to now + the server's write
// timeout (progressWriter), so a client that stops reading is cut off after that idle bound
// and one that keeps reading never is. A slow client costs no database connection meanwhile:
// rows are read in short batches (services.Audit.Attempts), each bounded by the store timeout.

// progressWriter extends conn's write deadline to now+idle as bytes are handed to w, at most
// every idle/4 (and at least every second) to keep the system calls rare. The bytes go to
// Fiber's stream pipe, which holds only a few chunks before the socket must take them, so
// handing bytes over is progress to the client up to those chunks.
type progressWriter struct {
	w    io.Writer
	conn net.Conn
	idle time.Duration
	last time.Time
}

func (p *progressWriter) Write(b []byte) (int, error) {
	every := min(p.idle/4, time.Second)
	if now := time.Now(); now.Sub(p.last) >= every {
		p.last = now
		if err := p.conn.SetWriteDeadline(now.Add(p.idle)); err != nil {
			return 0, err
		}
	}
	return p.w.Write(b)
}

// csvExportRetryAfter is the Retry-After (seconds) of an export refused because the
// instance runs as many as it may (Config.MaxConcurrentExports).
const csvExportRetryAfter = "30"

// csvFlushRows is how many rows are buffered before they are pushed to the client.
const csvFlushRows = 256

// auditCSVHeader is the export's first row (docs/reference.md §5 "CSV export").
// possible_duplicate_effect is last, so readers that index the older columns keep working.
var auditCSVHeader = []string{"tenant", "key", "attempted_at", "result", "operation_id", "attempt_id", "caller", "fingerprint", "correlation_id",
	"possible_duplicate_effect"}

// auditQuery is the Audit page's query string as given; From, To and Tenant also drive the
// export. Flagged and Sort only shape the page's rows: the export lists every attempt.
type auditQuery struct {
	From, To, Tenant string
	Flagged          bool
	Sort             string
}

// auditSorts are the Audit page's row orders; the first is the default.
var auditSorts = []views.Option{
	{Value: "last", Label: "Latest attempt first"},
	{Value: "first", Label: "Earliest attempt first"},
	{Value: "attempts", Label: "Most attempts first"},
}

// shapeAuditGroups applies the page's flagged-only filter and sort to the report's groups
// (already capped at services.MaxAuditGroups, newest first).
func shapeAuditGroups(gs []services.AuditGroup, flagged bool, sort string) []services.AuditGroup {
	out := make([]services.AuditGroup, 0, len(gs))
	for _, g := range gs {
		if !flagged || g.PossibleDuplicateEffect {
			out = append(out, g)
		}
	}
	switch sort {
	case "first":
		slices.SortStableFunc(out, func(a, b services.AuditGroup) int { return a.FirstAt.Compare(b.FirstAt) })
	case "attempts":
		slices.SortStableFunc(out, func(a, b services.AuditGroup) int {
			return cmp.Compare(b.Duplicates+b.Conflicts, a.Duplicates+a.Conflicts)
		})
	}
	return out
}

// parseAuditQuery reads from, to and (for global accounts only) tenant. The strings are
// cloned because the export uses them after the handler returns, when Fiber has reused the
// request's buffers. The message is for the operator when a time is unusable.
func parseAuditQuery(c *fiber.Ctx, op *services.OperatorAccount) (auditQuery, services.AuditFilter, string) {
	q := auditQuery{From: strings.Clone(strings.TrimSpace(c.Query("from"))), To: strings.Clone(strings.TrimSpace(c.Query("to")))}
	if services.SeesAllTenants(op) {
		q.Tenant = strings.Clone(strings.TrimSpace(c.Query("tenant")))
	}
	q.Flagged = c.Query("flagged") != ""
	q.Sort = auditSorts[0].Value
	if hasSort := c.Query("sort"); hasSort != "" {
		for _, o := range auditSorts {
			if o.Value == hasSort {
				q.Sort = o.Value
			}
		}
	}
	f := services.AuditFilter{Tenant: q.Tenant}
	var ok bool
	if f.From, ok = parseAuditTime(q.From); !ok {
		return q, f, "From must be a date and time after 1970 such as 2026-01-31T09:30 (UTC)."
	}
	if f.To, ok = parseAuditTime(q.To); !ok {
		return q, f, "To must be a date and time after 1970 such as 2026-01-31T09:30 (UTC)."
	}
	return q, f, ""
}

// parseAuditTime parses one time parameter; "" is the zero time (the service's default). A
// time before 1970 is refused: no attempt is that old, and 0001-01-01T00:00:00Z, the zero
// time, would otherwise silently mean "no bound", the last 24 hours (issue 28).
func parseAuditTime(raw string) (time.Time, bool) {
	if raw == "" {
		return time.Time{}, true
	}
	for _, l := range auditTimeLayouts {
		if t, err := time.ParseInLocation(l, raw, time.UTC); err == nil {
			return t.UTC(), t.Unix() >= 0
		}
	}
	return time.Time{}, false
}

// values is q as query parameters, leaving out the empty ones.
func (q auditQuery) values() url.Values {
	v := url.Values{}
	flagged, sort := "", q.Sort
	if q.Flagged {
		flagged = "1"
	}
	if sort == auditSorts[0].Value {
		sort = ""
	}
	for k, x := range map[string]string{"from": q.From, "to": q.To, "tenant": q.Tenant, "flagged": flagged, "sort": sort} {
		if x != "" {
			v.Set(k, x)
		}
	}
	return v
}

// auditProblem maps a refused filter to the 400 page's message; ok is false for other errors.
func auditProblem(err error) (string, bool) {
	var de *services.Error
	if errors.As(err, &de) && de.Code == services.CodeInvalidRequest {
		return filterProblem(de), true
	}
	return "", false
}

// handleAuditPage is GET /audit: duplicate and conflicting attempts, and admissions that were
// a possible duplicate effect, grouped by key; each row links to its operation.
func handleAuditPage(s *Server) fiber.Handler {
	return func(c *fiber.Ctx) error {
		op := currentOperator(c)
		if op == nil {
			return redirectToLogin(c)
		}
		q, f, problem := parseAuditQuery(c, op)
		if problem != "" {
			return s.renderErrorPage(c, fiber.StatusBadRequest, problem)
		}
		f.FlaggedOnly = q.Flagged
		rep, err := s.audit.Report(c.UserContext(), op.TenantID, f)
		if msg, ok := auditProblem(err); ok {
			return s.renderErrorPage(c, fiber.StatusBadRequest, msg)
		} else if err != nil {
			return err
		}
		nav, err := s.navFor(c, op, "audit")
		if err != nil {
			return err
		}
		csvURL := "/audit.csv"
		pageOnly := q
		pageOnly.Flagged, pageOnly.Sort = false, ""
		if v := pageOnly.values(); len(v) > 0 {
			csvURL += "?" + v.Encode()
		}
		const shown = "2006-01-02 15:04:05"
		props := views.AuditProps{
			Nav:        nav,
			ShowTenant: services.SeesAllTenants(op),
			Filter: views.AuditFilterView{
				From: rep.Filter.From.Format(auditInputLayout), To: rep.Filter.To.Format(auditInputLayout),
				Tenant: q.Tenant, Active: len(q.values()) > 0, Flagged: q.Flagged, Sort: q.Sort, Sorts: auditSorts,
			},
			Range:     rep.Filter.From.Format(shown) + " – " + rep.Filter.To.Format(shown) + " UTC",
			Rows:      make([]views.AuditRowView, 0, len(rep.Groups)),
			Truncated: rep.Truncated,
			Cap:       strconv.Itoa(services.MaxAuditGroups),
			ScanCap:   humanize.Comma(services.AuditScanCap),
			CSVURL:    csvURL,
		}
		if props.ShowTenant {
			ts, err := s.dash.Tenants(c.UserContext())
			if err != nil {
				return err
			}
			for _, t := range ts {
				props.Filter.Tenants = append(props.Filter.Tenants, t.Name)
			}
		}
		for _, g := range shapeAuditGroups(rep.Groups, q.Flagged, q.Sort) {
			tenant := g.TenantName
			if tenant == "" {
				tenant = "#" + strconv.FormatInt(g.TenantID, 10)
			}
			props.Rows = append(props.Rows, views.AuditRowView{
				Key: g.Key, Tenant: tenant,
				Duplicates: strconv.FormatInt(g.Duplicates, 10), Conflicts: strconv.FormatInt(g.Conflicts, 10),
				First: g.FirstAt.UTC().Format(shown), FirstISO: g.FirstAt.UTC().Format(time.RFC3339Nano),
				Last: g.LastAt.UTC().Format(shown), LastISO: g.LastAt.UTC().Format(time.RFC3339Nano),
				PossibleDuplicateEffect: g.PossibleDuplicateEffect,
			})
			if g.OperationID != "" {
				props.Rows[len(props.Rows)-1].OperationURL = operationURL(g.OperationID)
			}
		}
		props.Total = auditTotal(len(props.Rows), rep.Truncated, q.Flagged)
		props.LatestURL, props.NewerURL, props.OlderURL = auditPager(q, rep.Filter.From, rep.Filter.To, time.Now())
		return render(c, fiber.StatusOK, views.AuditPage(props))
	}
}

// handleAuditCSV is GET /audit.csv: every duplicate or conflicting attempt of the Audit
// page's filter, one CSV row each, streamed batch by batch so an export of any size needs
// constant memory, and a client that reads slowly (or not at all) holds no database
// connection: as many stalled downloads as the pool has connections used to stop admission. A bad filter is refused with the 400 page before anything
// is streamed.
func handleAuditCSV(s *Server) fiber.Handler {
	return func(c *fiber.Ctx) error {
		op := currentOperator(c)
		if op == nil {
			return redirectToLogin(c)
		}
		_, f, problem := parseAuditQuery(c, op)
		if problem != "" {
			return s.renderErrorPage(c, fiber.StatusBadRequest, problem)
		}
		select {
		case s.exports <- struct{}{}:
		default:
			c.Set(fiber.HeaderRetryAfter, csvExportRetryAfter)
			return s.renderErrorPage(c, fiber.StatusTooManyRequests, fmt.Sprintf(
				"This instance is already running %d CSV exports, its limit. Try again in a minute.", cap(s.exports)))
		}
		streaming := false
		defer func() {
			if !streaming {
				<-s.exports
			}
		}()
		f, err := s.audit.ResolveFilter(c.UserContext(), f)
		if msg, ok := auditProblem(err); ok {
			return s.renderErrorPage(c, fiber.StatusBadRequest, msg)
		} else if err != nil {
			return err
		}
		const stamp = "20060102T150405Z"
		name := "idemgate-audit-" + f.From.Format(stamp) + "-" + f.To.Format(stamp) + ".csv"
		c.Set(fiber.HeaderContentType, "text/csv; charset=utf-8")
		c.Set(fiber.HeaderContentDisposition, `attachment; filename="`+name+`"`)
		// The writer runs after this handler has returned, so it may use only copies: not c,
		// not the request's context, not strings that point into Fiber's buffers.
		var tenantID *int64
		if op.TenantID != nil {
			id := *op.TenantID
			tenantID = &id
		}
		reqID, log := requestID(c), s.log // requestID is a copy already
		// The connection outlives the handler: it is what the stream is written to.
		conn := c.Context().Conn()
		// The writer always runs (fasthttp starts it here, and unblocks it if the response is
		// never sent), so it is what gives the export's slot back.
		streaming = true
		c.Context().SetBodyStreamWriter(func(w *bufio.Writer) {
			defer func() { <-s.exports }()
			ctx := logging.ContextWithRequestID(context.Background(), reqID)
			cw := csv.NewWriter(&progressWriter{w: w, conn: conn, idle: s.writeTimeout})
			_ = cw.Write(auditCSVHeader)
			n := 0
			err := s.audit.Attempts(ctx, tenantID, f, s.storeTimeout, func(r services.AuditRow) error {
				if err := cw.Write(auditCSVRecord(r)); err != nil {
					return err
				}
				if n++; n%csvFlushRows == 0 {
					cw.Flush()
					if err := cw.Error(); err != nil {
						return err
					}
					return w.Flush() // fails once the client has gone (or stopped reading), which stops the export
				}
				return nil
			})
			if err != nil {
				log.ErrorContext(ctx, "audit export failed", "rows", n, "err", err)
				// The status is long sent; a last full-width row tells a reader the file is
				// incomplete rather than letting it pass for the whole audit.
				_ = cw.Write(append([]string{"ERROR: export incomplete, download again"}, make([]string, len(auditCSVHeader)-1)...))
			}
			cw.Flush()
			_ = w.Flush()
		})
		return nil
	}
}

// auditCSVRecord is one attempt as a CSV row, in auditCSVHeader's order.
func auditCSVRecord(r services.AuditRow) []string {
	return []string{
		csvCell(r.TenantName), csvCell(r.Key), r.AttemptedAt.UTC().Format(time.RFC3339Nano), csvCell(r.Result),
		csvCell(r.OperationID), csvCell(r.AttemptID), csvCell(r.Caller), csvCell(r.Fingerprint), csvCell(r.CorrelationID),
		strconv.FormatBool(r.PossibleDuplicateEffect),
	}
}

// csvCell neutralises spreadsheet formula injection (OWASP "CSV Injection"): keys and the other
// client-chosen fields could start with a character that makes Excel or LibreOffice evaluate
// the cell, so such a cell gets a leading single quote and is shown as text.
func csvCell(s string) string {
	if s != "" && strings.ContainsRune("=+-@\t\r", rune(s[0])) {
		return "'" + s
	}
	return s
}

// auditTotal words the Audit page's total: n keys shown, exact unless the report stopped at
// services.MaxAuditGroups (truncated: then "n+"), with possible duplicate effects only when
// flagged. The report reads at most MaxAuditGroups+1 groups, so this costs no extra query.
func auditTotal(n int, truncated, flagged bool) string {
	s := humanize.Comma(int64(n))
	if truncated {
		s += "+"
	}
	noun := " keys"
	if n == 1 && !truncated {
		noun = " key"
	}
	if flagged {
		return s + noun + " with a possible duplicate effect in this range."
	}
	return s + noun + " in this range."
}

// auditPager pages the Audit page by time, newest first like the Keys page: "Older" is the
// range of the same length just before from–to, "Newer" the one just after (none once the
// range reaches now, give or take a minute), "Latest" the default range (none when the range reaches now). The
// report itself is capped (services.MaxAuditGroups), so moving the window is its pagination.
// The tenant, flagged-only filter and sort are kept.
func auditPager(q auditQuery, from, to, now time.Time) (latest, newer, older string) {
	width := to.Sub(from)
	at := func(f, t time.Time) string {
		q.From, q.To = f.UTC().Format(time.RFC3339Nano), t.UTC().Format(time.RFC3339Nano)
		return "/audit?" + q.values().Encode()
	}
	older = at(from.Add(-width), from)
	// A range ending within a minute of now reaches it: the default one ends at the
	// database's now, a moment before this server's.
	if to.Before(now.Add(-time.Minute)) {
		newer = at(to, to.Add(width))
		q.From, q.To = "", ""
		latest = "/audit"
		if v := q.values(); len(v) > 0 {
			latest += "?" + v.Encode()
		}
	}
	return latest, newer, older
}
