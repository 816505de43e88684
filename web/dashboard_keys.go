package web

import (
	"errors"
	"fmt"
	"github.com/dustin/go-humanize"
	"math"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/idemgate/idemgate/services"
	"github.com/idemgate/idemgate/views"
)

// keysPageSizes are the page sizes the Keys page offers; keysPageSize is the default.
var keysPageSizes = []int{25, 50, 100, 200}

const keysPageSize = 50

// keyStates are the state filter's choices, in lifecycle order.
var keyStates = []views.Option{
	{Value: services.StateInProgress, Label: "In progress"},
	{Value: services.StateUncertain, Label: "Uncertain (newest operation)"},
	{Value: services.StateSucceeded, Label: "Succeeded"},
	{Value: services.StateFailed, Label: "Failed"},
	{Value: services.StateReleased, Label: "Released"},
}

// keysQuery is the Keys page's query string: plain GET parameters, so filters and pages are
// links that work without JavaScript and can be shared.
type keysQuery struct {
	// Tenant narrows a global account's list to one tenant (by name); ignored for restricted
	// accounts, which see one tenant anyway.
	Tenant    string
	State     string
	Operation string
	Prefix    string
	Expiring  bool
	Limit     int
	Cursor    string
	// Newer is a page's "newer" cursor (parameter newer): the page of keys just newer.
	Newer string
}

// expiringSoon is the horizon of the "expiring soon" filter.
const expiringSoon = 5 * time.Minute

// parseKeysQuery reads the query string; the string is a message for the operator when a
// parameter is unusable. The service validates state, operation and cursor.
func parseKeysQuery(c *fiber.Ctx) (keysQuery, string) {
	q := keysQuery{
		Tenant:    strings.TrimSpace(c.Query("tenant")),
		State:     strings.TrimSpace(c.Query("state")),
		Operation: strings.TrimSpace(c.Query("operation")),
		Prefix:    c.Query("prefix"),
		Expiring:  c.Query("expiring") != "",
		Cursor:    c.Query("cursor"),
		Newer:     c.Query("newer"),
		Limit:     keysPageSize,
	}
	if raw := c.Query("limit"); raw != "" {
		n, err := strconv.Atoi(raw)
		if err != nil || n < 1 || n > services.MaxListLimit {
			return q, fmt.Sprintf("Per page must be a number from 1 to %d.", services.MaxListLimit)
		}
		q.Limit = n
	}
	return q, ""
}

// url returns the Keys page URL for q, leaving out parameters at their defaults.
func (q keysQuery) url() string {
	v := url.Values{}
	if q.Tenant != "" {
		v.Set("tenant", q.Tenant)
	}
	if q.State != "" {
		v.Set("state", q.State)
	}
	if q.Operation != "" {
		v.Set("operation", q.Operation)
	}
	if q.Prefix != "" {
		v.Set("prefix", q.Prefix)
	}
	if q.Expiring {
		v.Set("expiring", "1")
	}
	if q.Limit != keysPageSize {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	if q.Cursor != "" {
		v.Set("cursor", q.Cursor)
	}
	if q.Newer != "" {
		v.Set("newer", q.Newer)
	}
	if len(v) == 0 {
		return "/keys"
	}
	return "/keys?" + v.Encode()
}

// handleKeysPage is GET /keys: the read-only list of keys the operator may see, newest first.
func handleKeysPage(s *Server) fiber.Handler {
	return func(c *fiber.Ctx) error {
		op := currentOperator(c)
		if op == nil {
			return redirectToLogin(c)
		}
		q, problem := parseKeysQuery(c)
		if problem != "" {
			return s.renderErrorPage(c, fiber.StatusBadRequest, problem)
		}
		tenant, err := s.keysTenant(c, op, &q)
		if err != nil {
			return err
		}
		page, err := s.dash.ListKeysForOperator(c.UserContext(), tenant, q.filter())
		var de *services.Error
		if errors.As(err, &de) && de.Code == services.CodeInvalidRequest {
			return s.renderErrorPage(c, fiber.StatusBadRequest, filterProblem(de))
		} else if err != nil {
			return err
		}
		total, err := s.dash.CountKeys(c.UserContext(), tenant, q.countFilter())
		if err != nil {
			return err
		}
		props, err := s.keysProps(c, op, q, page, total)
		if err != nil {
			return err
		}
		return render(c, fiber.StatusOK, views.KeysPage(props))
	}
}

// keysTenant is the tenant whose keys the page lists: the tenant filter of a global account
// that set one, else op's own tenant (nil for a global account: every tenant). A tenant filter
// that does not apply is cleared from q, so the page's links do not carry it.
func (s *Server) keysTenant(c *fiber.Ctx, op *services.OperatorAccount, q *keysQuery) (*int64, error) {
	if !services.SeesAllTenants(op) || q.Tenant == "" {
		q.Tenant = ""
		return op.TenantID, nil
	}
	n, err := s.dash.TenantID(c.UserContext(), q.Tenant)
	if err != nil {
		return nil, err
	}
	return &n, nil
}

// filter is q as the service's filter of one page of keys.
func (q keysQuery) filter() services.KeyFilter {
	f := q.countFilter()
	f.Limit, f.Cursor, f.Before = q.Limit, q.Cursor, q.Newer
	return f
}

// countFilter is q's filter without its paging, for the page's total.
func (q keysQuery) countFilter() services.KeyFilter {
	return services.KeyFilter{State: q.State, Operation: q.Operation, KeyPrefix: q.Prefix,
		ExpiringWithin: expiringWithin(q.Expiring)}
}

// keysProps is what the Keys page shows of page, read with q: the navigation, the filter
// form, the total, the rows and the links to other pages.
func (s *Server) keysProps(c *fiber.Ctx, op *services.OperatorAccount, q keysQuery, page *services.OperatorKeyPage,
	total services.KeyCount) (views.KeysProps, error) {
	nav, err := s.navFor(c, op, "keys")
	if err != nil {
		return views.KeysProps{}, err
	}
	props := views.KeysProps{
		Nav:        nav,
		ShowTenant: services.SeesAllTenants(op),
		Filter: views.KeysFilter{
			State: q.State, Operation: q.Operation, Prefix: q.Prefix, Expiring: q.Expiring,
			Limit: strconv.Itoa(q.Limit), States: keyStates, Limits: pageSizeOptions(q.Limit),
			Active: q.active(),
			Tenant: q.Tenant,
		},
		Total:                  keyTotal(total, q.active()),
		SelfURL:                q.url(),
		NeedsReconciliationURL: queueURL, // operations, superseded ones too: not a filter of keys
		ExpiringSoonURL:        keysQuery{Expiring: true, Limit: q.Limit}.url(),
		Rows:                   keyRows(q, page),
	}
	if props.ShowTenant {
		if props.Filter.Tenants, err = s.tenantOptions(c); err != nil {
			return views.KeysProps{}, err
		}
	}
	props.NewestURL, props.NewerURL, props.OlderURL = q.pageURLs(page)
	return props, nil
}

// tenantOptions are the choices of a tenant filter: every tenant, by name.
func (s *Server) tenantOptions(c *fiber.Ctx) ([]views.Option, error) {
	ts, err := s.dash.Tenants(c.UserContext())
	if err != nil {
		return nil, err
	}
	var opts []views.Option
	for _, t := range ts {
		opts = append(opts, views.Option{Value: t.Name, Label: t.Name})
	}
	return opts, nil
}

// keyRows are the rows of page, read with q. The operation pages they link to link back to
// this filtered list ("← Keys" keeps the filter).
func keyRows(q keysQuery, page *services.OperatorKeyPage) []views.KeyRow {
	back := ""
	if self := q.url(); self != "/keys" {
		back = self
	}
	rows := make([]views.KeyRow, 0, len(page.Items))
	for _, it := range page.Items {
		r := keyRow(it, page.Now)
		if r.OperationURL != "" {
			r.OperationURL = withBack(r.OperationURL, back)
		}
		rows = append(rows, r)
	}
	return rows
}

// pageURLs are the links from page, read with q, to the newest page and the pages just newer
// and just older; "" where there is none.
func (q keysQuery) pageURLs(page *services.OperatorKeyPage) (newest, newer, older string) {
	if page.PrevCursor != "" {
		first := q
		first.Cursor, first.Newer = "", ""
		newest = first.url()
		first.Newer = page.PrevCursor
		newer = first.url()
	}
	if page.NextCursor != "" {
		next := q
		next.Cursor, next.Newer = page.NextCursor, ""
		older = next.url()
	}
	return newest, newer, older
}

func expiringWithin(on bool) time.Duration {
	if on {
		return expiringSoon
	}
	return 0
}

// filterProblem turns a refused filter into one sentence for the error page.
func filterProblem(de *services.Error) string {
	if len(de.Fields) == 0 {
		return de.Message
	}
	return "The filter is not valid: " + fieldProblems(de, nil)
}

// fieldProblems joins a validation error's fields into one sentence for a dashboard page,
// naming each field by its form label where labels has one; with no fields it gives the
// error's message.
func fieldProblems(de *services.Error, labels map[string]string) string {
	parts := make([]string, 0, len(de.Fields))
	for _, f := range de.Fields {
		label := labels[f.Field]
		if label == "" {
			label = f.Field
		}
		parts = append(parts, label+" "+f.Message)
	}
	if len(parts) == 0 {
		return de.Message
	}
	return strings.Join(parts, "; ") + "."
}

func pageSizeOptions(current int) []views.Option {
	opts := make([]views.Option, 0, len(keysPageSizes)+1)
	known := false
	for _, n := range keysPageSizes {
		known = known || n == current
		opts = append(opts, views.Option{Value: strconv.Itoa(n), Label: strconv.Itoa(n)})
	}
	if !known { // a hand-written ?limit= stays selected
		opts = append(opts, views.Option{Value: strconv.Itoa(current), Label: strconv.Itoa(current)})
	}
	return opts
}

// keyRow formats one key for the table. now is the database time the page was read at.
func keyRow(v services.TenantKeyView, now time.Time) views.KeyRow {
	r := views.KeyRow{
		Key:           v.Key,
		Tenant:        v.TenantName,
		AcquiredAt:    v.AcquiredAt.UTC().Format("2006-01-02 15:04:05"),
		AcquiredAtISO: v.AcquiredAt.UTC().Format(time.RFC3339),
		FencingToken:  "—",
		Duplicates:    "0",
		TTL:           "—",
		TTLKind:       views.TTLNone,
	}
	if v.TenantName == "" {
		r.Tenant = "#" + strconv.FormatInt(v.TenantID, 10)
	}
	op := v.Operation
	if op != nil {
		if r.Tombstone = op.EvidencePurged; !r.Tombstone { // a purged operation has no page
			r.OperationURL = "/operations/" + url.PathEscape(op.ID)
		}
		r.State = op.State
		r.NeedsAttention = services.NeedsReconciliation(op.State)
		r.FencingToken = strconv.FormatInt(op.FencingToken, 10)
		r.Duplicates = strconv.FormatInt(op.DuplicateAttempts, 10)
		if op.Operation != nil {
			r.Operation = *op.Operation
		}
		switch op.ConflictAttempts {
		case 0:
		case 1:
			r.Conflicts = "+1 conflict"
		default:
			r.Conflicts = "+" + strconv.FormatInt(op.ConflictAttempts, 10) + " conflicts"
		}
	}
	if op != nil {
		r.Hold = op.OnExpiry == services.OnExpiryHold
		// A lapsed lease reads the same before the lapse is applied (still in_progress) and
		// after (uncertain, lease_expired_without_outcome): the outcome is unknown either way.
		switch {
		case op.State == services.StateUncertain && op.StateReason != nil && *op.StateReason == services.ReasonLeaseExpired:
			r.Lease, r.LeaseLapsed = "lease lapsed", true
		case op.State == services.StateInProgress && op.LeaseExpiresAt.Before(op.ExpiresAt):
			if left := op.LeaseExpiresAt.Sub(now); left > 0 {
				r.Lease = "lease expires " + formatTTL(left)
			} else {
				r.Lease, r.LeaseLapsed, r.NeedsAttention = "lease lapsed", true, true
			}
		}
	}
	switch hold, left := v.HoldAt(now); {
	case hold == services.HoldLive && r.LeaseLapsed:
		r.TTL, r.TTLKind = formatTTL(left), views.TTLProtected
	case hold == services.HoldLive:
		r.TTL, r.TTLKind, r.TTLMillis = formatTTL(left), views.TTLLive, strconv.FormatInt(left.Milliseconds(), 10)
	case op != nil && op.ProtectedUntil != nil && op.ProtectedUntil.After(now):
		r.TTL, r.TTLKind = formatTTL(op.ProtectedUntil.Sub(now)), views.TTLHorizon
	case hold == services.HoldExpired:
		r.TTL, r.TTLKind = "expired", views.TTLExpired
	}
	return r
}

// formatTTL renders time left the way static/app.js does: "42s", "4m 12s", "3h 05m", "2d 4h".
func formatTTL(d time.Duration) string {
	secs := int64(math.Ceil(d.Seconds()))
	if secs <= 0 {
		return "expired"
	}
	days, hours := secs/86400, secs%86400/3600
	mins, s := secs%3600/60, secs%60
	switch {
	case days > 0:
		return fmt.Sprintf("%dd %dh", days, hours)
	case hours > 0:
		return fmt.Sprintf("%dh %02dm", hours, mins)
	case mins > 0:
		return fmt.Sprintf("%dm %02ds", mins, s)
	}
	return fmt.Sprintf("%ds", s)
}

// keyTotal words the Keys page's total: "2,345 keys.", "1 key matches the filter.",
// "1,000+ keys." when the count stopped at its cap (services.KeyCountCap).
func keyTotal(n services.KeyCount, filtered bool) string {
	s := humanize.Comma(n.N)
	if n.Capped {
		s += "+"
	}
	one := n.N == 1 && !n.Capped
	switch {
	case one && filtered:
		return "1 key matches the filter."
	case one:
		return "1 key."
	case filtered:
		return s + " keys match the filter."
	}
	return s + " keys."
}

// active reports whether any filter is set (the page size and cursors are no filter).
func (q keysQuery) active() bool {
	return q.State != "" || q.Operation != "" || q.Prefix != "" || q.Expiring || q.Tenant != ""
}
