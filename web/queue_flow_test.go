package web

import (
	"context"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"
	"github.com/idemgate/idemgate/services"
	"github.com/stretchr/testify/require"
)

// uncertainOp admits key in p's tenant and has its owner report the outcome uncertain, so it
// joins the reconciliation queue at once.
func (f *dashFixture) uncertainOp(t *testing.T, p services.Principal, key string) *services.Acquisition {
	t.Helper()
	a := f.opAcquire(t, p, key, 300, "")
	_, err := f.s.adm.RecordOutcome(context.Background(), p, a.OperationID, services.OutcomeInput{OwnerToken: a.OwnerToken,
		Status: services.StateUncertain})
	require.NoError(t, err)
	return a
}

func TestHumanReason(t *testing.T) {
	for code, want := range map[string]string{
		"":                              "",
		"ttl_expired_without_outcome":   "TTL expired without an outcome",
		"lease_expired_without_outcome": "Lease expired without an outcome",
		"something_new":                 "Something new",
		"x":                             "X",
	} {
		require.Equal(t, want, humanReason(code), code)
	}
}

func TestSafeBack(t *testing.T) {
	for raw, want := range map[string]string{
		"":                                 "",
		"/keys":                            "/keys",
		"/keys?state=uncertain&prefix=a b": "/keys?prefix=a+b&state=uncertain",
		"/reconciliation?reason=x":         "/reconciliation?reason=x",
		"/audit?flagged=1":                 "/audit?flagged=1",
		"//evil.example/keys":              "",
		"https://evil.example/keys":        "",
		"/admin":                           "",
		"/keys#frag":                       "",
		"/keys/../admin":                   "",
		"javascript:alert(1)":              "",
	} {
		require.Equal(t, want, safeBack(raw), raw)
	}
}

// FuzzSafeBack: whatever the back parameter says, the link is one of the list pages on this
// site, and cleaning it again changes nothing.
func FuzzSafeBack(f *testing.F) {
	for _, s := range []string{"/keys?state=uncertain", "/reconciliation", "//x", "/audit?a=%zz", "/keys?\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		got := safeBack(raw)
		if got == "" {
			return
		}
		path, _, _ := strings.Cut(got, "?")
		if _, ok := backTargets[path]; !ok {
			t.Fatalf("safeBack(%q) = %q: not a list page", raw, got)
		}
		if again := safeBack(got); again != got {
			t.Fatalf("safeBack not idempotent: %q -> %q -> %q", raw, got, again)
		}
	})
}

// TestQueueFlow: from "Reconcile next", each outcome recorded from the queue lands on the next
// queue item with a flash naming what was recorded, oldest first, and the last one lands on the
// empty queue; the filter rides along in the back link and the form.
func TestQueueFlow(t *testing.T) {
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		b := newDashBrowser(t, f.s)
		b.mustLogin(f.restricted)
		first := f.uncertainOp(t, f.pA, "flow-1")
		second := f.uncertainOp(t, f.pA, "flow-2")
		third := f.uncertainOp(t, f.pA, "flow-3")
		f.uncertainOp(t, f.pB, "flow-other-tenant") // not in tenant A's queue

		queue := b.get("/reconciliation")
		require.Equal(t, http.StatusOK, queue.status, queue.body)
		require.Equal(t, withBack("/operations/"+first.OperationID, "/reconciliation"), queue.testid("queue-link").First().AttrOr("href", ""))
		require.Equal(t, "3 operations need reconciliation.", strings.Join(strings.Fields(queue.testid("queue-total").Text()), " "))
		require.Regexp(t, `^[0-9]+s$`, strings.TrimSpace(queue.testid("queue-age").First().Text()), "age of a fresh item")
		require.Equal(t, "0", queue.testid("queue-table").Parent().AttrOr("tabindex", ""), "the table scrolls in a focusable region")

		res := b.get("/reconciliation/next")
		require.Equal(t, http.StatusSeeOther, res.status)
		loc := res.header.Get("Location")
		require.Equal(t, withBack("/operations/"+first.OperationID, "/reconciliation"), loc)

		want := []*services.Acquisition{second, third}
		for i, cur := range []*services.Acquisition{first, second, third} {
			page := b.get(loc)
			require.Equal(t, http.StatusOK, page.status, page.body)
			require.Contains(t, page.body, "op-record", "the outcome form")
			require.Less(t, strings.Index(page.body, `data-testid="outcome-form"`), strings.Index(page.body, `id="op-fields"`),
				"an uncertain operation's outcome form comes first")
			require.Equal(t, "← Queue", strings.TrimSpace(page.testid("op-back").Text()))
			require.Equal(t, "/reconciliation", page.testid("op-back").AttrOr("href", ""))
			require.Equal(t, "/reconciliation", page.testid("outcome-form").Find(`input[name="back"]`).AttrOr("value", ""))
			res := b.post("/operations/"+cur.OperationID+"/outcome", url.Values{"status": {"failed"}, "note": {"checked"},
				"back": {"/reconciliation"}, "_csrf": {page.csrf(t)}})
			require.Equal(t, http.StatusSeeOther, res.status, res.body)
			loc = res.header.Get("Location")
			if i < len(want) {
				require.Equal(t, withBack("/operations/"+want[i].OperationID, "/reconciliation")+"&recorded="+cur.OperationID, loc)
				next := b.get(loc)
				require.Equal(t, "Recorded failed for "+cur.Key+" — next: "+want[i].Key+".", strings.TrimSpace(next.testid("flash").Text()))
			} else {
				require.Equal(t, "/reconciliation?recorded="+cur.OperationID, loc)
				empty := b.get(loc)
				require.Equal(t, 1, empty.testid("queue-empty").Length())
				require.Equal(t, "Recorded failed for "+cur.Key+" — the queue is empty.", strings.TrimSpace(empty.testid("flash").Text()))
			}
			d := f.opDetail(t, f.pA, cur.OperationID)
			require.Equal(t, services.StateFailed, d.State)
			require.Equal(t, f.restricted, d.Outcome.RecordedBy)
		}

		// An empty queue: "Reconcile next" lands on it. A crafted recorded= of another tenant
		// shows nothing.
		res = b.get("/reconciliation/next?reason=ttl_expired_without_outcome")
		require.Equal(t, "/reconciliation?reason=ttl_expired_without_outcome", res.header.Get("Location"))
		other := f.uncertainOp(t, f.pB, "flow-other-2")
		require.Zero(t, b.get("/reconciliation?recorded="+other.OperationID).testid("flash").Length())
		// A filter that matches nothing says so; a bad one is refused.
		filtered := b.get("/reconciliation?reason=lease_expired_without_outcome")
		require.Contains(t, filtered.testid("queue-empty").Text(), "matches this filter")
		require.Equal(t, http.StatusBadRequest, b.get("/reconciliation?before=yesterday").status)
		require.Equal(t, http.StatusBadRequest, b.get("/reconciliation?reason=Not-A-Code").status)
	})
}

// TestQueueFilterCarried: the queue's filter is kept in every row's link, the back link and the
// next item; the before filter narrows the list.
func TestQueueFilterCarried(t *testing.T) {
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		b := newDashBrowser(t, f.s)
		b.mustLogin(f.restricted)
		a := f.uncertainOp(t, f.pA, "carry-1")
		f.uncertainOp(t, f.pA, "carry-2")
		back := "/reconciliation?before=2999-01-01T00%3A00"
		page := b.get(back)
		require.Equal(t, 2, page.testid("queue-row").Length())
		require.Equal(t, "2 operations match the filter.", strings.Join(strings.Fields(page.testid("queue-total").Text()), " "))
		require.Equal(t, withBack("/operations/"+a.OperationID, back), page.testid("queue-link").First().AttrOr("href", ""))
		op := b.get(page.testid("queue-link").First().AttrOr("href", ""))
		require.Equal(t, back, op.testid("op-back").AttrOr("href", ""))
		require.Zero(t, b.get("/reconciliation?before=2000-01-01T00:00").testid("queue-row").Length())
	})
}

// TestQueueOwnerReportedReason: an operation its owner reported uncertain (it has no
// state_reason: the system did not choose the state) reads "Reported uncertain by the caller"
// in the queue, not "—", and is a choice of the reason filter that lists exactly those, for the
// page, its count and a bulk reconciliation by filter alike (issue 28 item 11).
func TestQueueOwnerReportedReason(t *testing.T) {
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		b := newDashBrowser(t, f.s)
		b.mustLogin(f.restricted)
		reported := f.uncertainOp(t, f.pA, "reported-"+dashRandom())
		lapsed := f.opAcquire(t, f.pA, "lapsed-"+dashRandom(), 1, "")
		elapse(t, f.db, f.pA, time.Second, lapsed.Key) // the TTL of 1 s passes; the reaper makes it uncertain
		_, err := services.NewReaper(f.db, slog.New(slog.DiscardHandler), 0).RunOnce(context.Background())
		require.NoError(t, err)
		require.Equal(t, services.StateUncertain, f.opDetail(t, f.pA, lapsed.OperationID).State)

		queue := b.get("/reconciliation")
		require.Equal(t, http.StatusOK, queue.status, queue.body)
		reasons := map[string]string{}
		queue.testid("queue-reason").Each(func(_ int, s *goquery.Selection) {
			reasons[s.AttrOr("data-reason", "")] = strings.TrimSpace(s.Text())
		})
		require.Equal(t, map[string]string{services.ReasonReportedUncertain: "Reported uncertain by the caller",
			services.ReasonTTLExpired: "TTL expired without an outcome"}, reasons)
		require.Equal(t, 1, queue.doc.Find(`#q-reason option[value="`+services.ReasonReportedUncertain+`"]`).Length())

		only := b.get("/reconciliation?reason=" + services.ReasonReportedUncertain)
		require.Equal(t, http.StatusOK, only.status, only.body)
		require.Equal(t, 1, only.testid("queue-link").Length())
		require.Contains(t, only.testid("queue-link").AttrOr("href", ""), reported.OperationID)
		require.Equal(t, "1 operation matches the filter.", strings.Join(strings.Fields(only.testid("queue-total").Text()), " "))
	})
}
