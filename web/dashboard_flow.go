package web

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/idemgate/idemgate/services"
)

// reasonTexts are the words the dashboard shows for the state reasons the system writes
// (docs/reference.md §3 and §8): operators read sentences, not codes.
var reasonTexts = map[string]string{
	services.ReasonTTLExpired:        "TTL expired without an outcome",
	"lease_expired_without_outcome":  "Lease expired without an outcome",
	services.ReasonReportedUncertain: "Reported uncertain by the caller",
}

// humanReason turns a state reason code into words for the dashboard: the known codes by
// reasonTexts, any other code with its underscores as spaces and a capital first letter (a
// code added later still reads as words), and "" for none.
func humanReason(code string) string {
	if code == "" {
		return ""
	}
	if t, ok := reasonTexts[code]; ok {
		return t
	}
	s := strings.ReplaceAll(code, "_", " ")
	return strings.ToUpper(s[:1]) + s[1:]
}

// formatAge renders how long ago something happened, coarsely: "42s", "17m", "3h 05m",
// "2d 4h". A negative duration (clock skew) reads as "0s".
func formatAge(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	secs := int64(d / time.Second)
	days, hours, mins := secs/86400, secs%86400/3600, secs%3600/60
	switch {
	case days > 0:
		return fmt.Sprintf("%dd %dh", days, hours)
	case hours > 0:
		return fmt.Sprintf("%dh %02dm", hours, mins)
	case mins > 0:
		return fmt.Sprintf("%dm", mins)
	}
	return fmt.Sprintf("%ds", secs)
}

// backTargets are the list pages an operation page may link back to, with the link's label.
var backTargets = map[string]string{
	"/keys":  "← Keys",
	queueURL: "← Queue",
	"/audit": "← Audit",
}

// safeBack returns raw if it is one of the list pages of backTargets with any query string,
// re-encoded, else "". The operation page's "back" parameter carries the list's filter, so
// "← Keys" and "← Queue" return to the filtered list; nothing else may be put in the link.
func safeBack(raw string) string {
	if raw == "" || len(raw) > 2048 {
		return ""
	}
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || u.Fragment != "" {
		return ""
	}
	if _, ok := backTargets[u.Path]; !ok {
		return ""
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return ""
	}
	if len(q) == 0 {
		return u.Path
	}
	// The bound holds for the link as re-encoded too: encoding can triple a query (%XX),
	// and a link longer than the bound would be refused when it comes back.
	if out := u.Path + "?" + q.Encode(); len(out) <= 2048 {
		return out
	}
	return ""
}

// backLabel is the text of the back link to back (a value of safeBack), "← Keys" by default.
func backLabel(back string) string {
	path, _, _ := strings.Cut(back, "?")
	if l, ok := backTargets[path]; ok {
		return l
	}
	return "← Keys"
}

// isQueueBack reports whether back (a value of safeBack) is the reconciliation queue: the
// operation page was opened from the queue, so recording an outcome moves on to the next item.
func isQueueBack(back string) bool {
	path, _, _ := strings.Cut(back, "?")
	return path == queueURL
}

// withBack adds the back parameter to an operation page's URL; "" back leaves it alone.
func withBack(opURL, back string) string {
	if back == "" {
		return opURL
	}
	return opURL + "?back=" + url.QueryEscape(back)
}

// queueQuery is the reconciliation queue's filter as GET parameters: tenant (a global
// account's choice, by id), reason (a state reason code) and before (uncertain before this
// UTC time, "2006-01-02T15:04" as a datetime-local input sends it, or RFC 3339).
type queueQuery struct {
	Tenant string
	Reason string
	Before string
	Cursor string
	// Back is a page's "earlier" cursor (parameter back): the entries just before the page.
	Back string
}

// queueBeforeLayouts are the accepted spellings of the "before" filter.
var queueBeforeLayouts = []string{"2006-01-02T15:04", "2006-01-02T15:04:05", time.RFC3339Nano}

// parseQueueQuery reads the queue's filter from v. The string is a message for the operator
// when a parameter is unusable.
func parseQueueQuery(v url.Values) (queueQuery, string) {
	q := queueQuery{Tenant: strings.TrimSpace(v.Get("tenant")), Reason: strings.TrimSpace(v.Get("reason")),
		Before: strings.TrimSpace(v.Get("before")), Cursor: v.Get("cursor"), Back: v.Get("back")}
	if q.Before != "" {
		if _, ok := q.before(); !ok {
			return q, "Uncertain before must be a date and time such as 2026-01-31T14:00 (UTC)."
		}
	}
	return q, ""
}

// before parses q.Before (UTC when it names no zone).
func (q queueQuery) before() (time.Time, bool) {
	if q.Before == "" {
		return time.Time{}, true
	}
	for _, l := range queueBeforeLayouts {
		if t, err := time.ParseInLocation(l, q.Before, time.UTC); err == nil {
			return t.UTC(), true
		}
	}
	return time.Time{}, false
}

// tenantID is the tenant filter (a tenant's name, as on every page) as an id, nil for none;
// a name no tenant has is an id no tenant has, so the filter matches nothing.
func (s *Server) tenantID(ctx context.Context, q queueQuery) (*int64, error) {
	if q.Tenant == "" {
		return nil, nil
	}
	n, err := s.dash.TenantID(ctx, q.Tenant)
	if err != nil {
		return nil, err
	}
	return &n, nil
}

// values encodes q, leaving out empty parameters.
func (q queueQuery) values() url.Values {
	v := url.Values{}
	for k, s := range map[string]string{"tenant": q.Tenant, "reason": q.Reason, "before": q.Before, "cursor": q.Cursor, "back": q.Back} {
		if s != "" {
			v.Set(k, s)
		}
	}
	return v
}

// url is the queue page for q.
func (q queueQuery) url() string {
	if v := q.values(); len(v) > 0 {
		return queueURL + "?" + v.Encode()
	}
	return queueURL
}

// filterOnly is q without its page cursor: the filter a bulk job or the "next" item uses.
func (q queueQuery) filterOnly() queueQuery {
	q.Cursor, q.Back = "", ""
	return q
}

// active reports whether any filter is set.
func (q queueQuery) active() bool { return q.Tenant != "" || q.Reason != "" || q.Before != "" }
