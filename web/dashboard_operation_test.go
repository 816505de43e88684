package web

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"
	"github.com/idemgate/idemgate/services"
	"github.com/stretchr/testify/require"
)

// opAcquire acquires key in p's tenant with ttl seconds and, when attemptID is not "", an
// attempt_id, and requires admission.
func (f *dashFixture) opAcquire(t *testing.T, p services.Principal, key string, ttl int64, attemptID string) *services.Acquisition {
	t.Helper()
	in := services.AcquireInput{Key: key, TTLSeconds: ttl, Operation: &f.op}
	if attemptID != "" {
		in.AttemptID = &attemptID
	}
	a, err := f.s.adm.Acquire(context.Background(), p, in)
	require.NoError(t, err)
	require.True(t, a.Admitted)
	return a
}

// opDetail reads an operation through the service, as the JSON API would show it.
func (f *dashFixture) opDetail(t *testing.T, p services.Principal, id string) *services.OperationDetail {
	t.Helper()
	d, err := f.s.reads.GetOperation(context.Background(), p.TenantID, id)
	require.NoError(t, err)
	return d
}

func opSelText(s *goquery.Selection) string { return strings.TrimSpace(s.Text()) }

func TestDashboardOperationPage(t *testing.T) {
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		const xss = `<script>alert(1)</script>`
		ctx := context.Background()
		corr := `corr-<i>1</i>`
		a, err := f.s.adm.Acquire(ctx, f.pA, services.AcquireInput{Key: xss, TTLSeconds: 300, Operation: &f.op,
			CorrelationID: &corr, Metadata: json.RawMessage(`{"order":42,"html":"<b>bold</b>"}`)})
		require.NoError(t, err)
		f.acquire(t, f.pA, xss) // a duplicate attempt

		b := newDashBrowser(t, f.s)
		b.mustLogin(f.restricted)
		page := b.get("/operations/" + a.OperationID)
		require.Equal(t, http.StatusOK, page.status, page.body)
		requirePageHeaders(t, page)

		require.Equal(t, xss, opSelText(page.testid("op-key")))
		require.NotContains(t, page.body, xss, "the key is text, not markup")
		require.NotContains(t, page.body, "<b>bold</b>")
		require.NotContains(t, page.body, "<i>1</i>")
		page.doc.Find("script").Each(func(_ int, s *goquery.Selection) {
			_, ok := s.Attr("src")
			require.True(t, ok, "inline script element rendered")
		})
		require.Equal(t, services.StateInProgress, page.testid("op-state").AttrOr("data-state", ""))
		require.Contains(t, opSelText(page.testid("op-state")), "In progress", "the state has a text label")
		require.Equal(t, "1", opSelText(page.testid("op-fencing")))
		require.Equal(t, "Yes", opSelText(page.testid("op-held")))
		require.Equal(t, f.tenantA, opSelText(page.testid("op-tenant")))
		require.Equal(t, f.op, opSelText(page.testid("op-name")))
		require.Equal(t, corr, opSelText(page.testid("op-correlation")))
		require.Equal(t, "1", opSelText(page.testid("op-duplicates")))
		require.Equal(t, "{\n  \"order\": 42,\n  \"html\": \"<b>bold</b>\"\n}", page.testid("op-metadata").Text())
		require.Equal(t, "No outcome recorded yet.", opSelText(page.testid("outcome-status")))
		require.Equal(t, 1, page.testid("attempts").Length())
		require.Equal(t, 2, page.testid("attempt-row").Length(), "admitted and duplicate")
		require.Contains(t, opSelText(page.testid("attempt-row").First()), "admitted")
		require.Contains(t, opSelText(page.testid("attempt-row").Last()), "duplicate")
		require.Equal(t, 1, page.testid("events").Length())
		require.Equal(t, 1, page.testid("generation-row").Length())

		// An operator sees both forms, the release form carrying what the page showed.
		require.Equal(t, 1, page.testid("outcome-form").Length())
		require.Equal(t, 2, page.testid("outcome-form").Find(`input[type="radio"][name="status"]`).Length(), "outcome radios")
		require.Zero(t, page.testid("outcome-form").Find(`input[name="status"][checked]`).Length(),
			"the operator must choose the outcome; nothing is preselected")
		rel := page.testid("release-form")
		require.Equal(t, 1, rel.Length())
		require.Equal(t, "/operations/"+a.OperationID+"/release", rel.AttrOr("action", ""))
		require.Equal(t, a.OperationID, rel.Find(`input[name="operation_id"]`).AttrOr("value", ""))
		require.Equal(t, "1", rel.Find(`input[name="fencing_token"]`).AttrOr("value", ""))
		require.Equal(t, "yes", page.testid("release-confirm").AttrOr("value", ""))
		_, required := page.testid("release-confirm").Attr("required")
		require.True(t, required)
		require.NotEmpty(t, rel.Find(`input[name="_csrf"]`).AttrOr("value", ""))
		require.Equal(t, 0, page.testid("flash").Length())
		require.Equal(t, 0, page.testid("action-error").Length())

		// Unknown and malformed ids are a 404 page.
		for _, id := range []string{"00000000-0000-4000-8000-000000000000", "nope"} {
			res := b.get("/operations/" + id)
			require.Equal(t, http.StatusNotFound, res.status)
			require.Equal(t, "404", res.testid("error-status").Text())
		}
		// Signed out: to the sign-in page.
		res := newDashBrowser(t, f.s).get("/operations/" + a.OperationID)
		require.Equal(t, http.StatusSeeOther, res.status)
		require.True(t, strings.HasPrefix(res.header.Get("Location"), "/login?next="))
	})
}

func TestDashboardOperationReconcile(t *testing.T) {
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		ctx := context.Background()
		a := f.opAcquire(t, f.pA, "pay-1", 300, "")
		_, err := f.s.adm.RecordOutcome(ctx, f.pA, a.OperationID, services.OutcomeInput{OwnerToken: a.OwnerToken,
			Status: services.StateUncertain})
		require.NoError(t, err)

		b := newDashBrowser(t, f.s)
		b.mustLogin(f.restricted)
		page := b.get("/operations/" + a.OperationID)
		require.Equal(t, services.StateUncertain, page.testid("op-state").AttrOr("data-state", ""))
		require.Equal(t, 1, page.testid("outcome-form").Length())
		require.Equal(t, 0, page.testid("release-form").Length(), "uncertain: reconcile, do not release")

		receipt := `ch_<b>42</b>`
		res := b.post("/operations/"+a.OperationID+"/outcome", url.Values{"status": {"succeeded"}, "receipt": {receipt},
			"note": {"Found the charge in the PSP dashboard"}, "_csrf": {page.csrf(t)}})
		require.Equal(t, http.StatusSeeOther, res.status, res.body)
		require.Equal(t, "/operations/"+a.OperationID+"?done=outcome", res.header.Get("Location"))

		page = b.get(res.header.Get("Location"))
		require.Equal(t, http.StatusOK, page.status)
		require.Equal(t, "Outcome recorded.", opSelText(page.testid("flash")))
		require.Equal(t, services.StateSucceeded, page.testid("op-state").AttrOr("data-state", ""))
		require.Equal(t, "succeeded", opSelText(page.testid("outcome-status")))
		require.Equal(t, receipt, opSelText(page.testid("outcome-receipt")))
		require.NotContains(t, page.body, "<b>42</b>")
		require.Equal(t, f.restricted, opSelText(page.testid("outcome-by")))
		require.Equal(t, 0, page.testid("outcome-form").Length(), "nothing left to record")
		last := page.testid("event-row").Last()
		require.Contains(t, opSelText(last), f.restricted)
		require.Contains(t, opSelText(last), "uncertain -> succeeded")

		d := f.opDetail(t, f.pA, a.OperationID)
		require.Equal(t, services.StateSucceeded, d.State)
		require.Equal(t, f.restricted, d.Outcome.RecordedBy)
		require.Equal(t, receipt, *d.Outcome.Receipt)
		require.Equal(t, "Found the charge in the PSP dashboard", *d.Outcome.Note)
		ev := d.Events[len(d.Events)-1]
		require.Equal(t, services.EventOutcome, ev.Kind)
		require.Equal(t, f.restricted, ev.Actor)

		// Submitting again (a stale form) is refused with the reason, and changes nothing.
		res = b.post("/operations/"+a.OperationID+"/outcome", url.Values{"status": {"failed"},
			"note": {"again"}, "_csrf": {page.csrf(t)}})
		require.Equal(t, http.StatusConflict, res.status)
		require.Contains(t, opSelText(res.testid("action-error")), "Not recorded:")
		require.Equal(t, services.StateSucceeded, f.opDetail(t, f.pA, a.OperationID).State)
	})
}

func TestDashboardOperationReleaseFailed(t *testing.T) {
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		ctx := context.Background()
		a := f.opAcquire(t, f.pA, "refund-1", 300, "")
		_, err := f.s.adm.RecordOutcome(ctx, f.pA, a.OperationID, services.OutcomeInput{OwnerToken: a.OwnerToken,
			Status: services.StateFailed})
		require.NoError(t, err)

		b := newDashBrowser(t, f.s)
		b.mustLogin(f.restricted)
		page := b.get("/operations/" + a.OperationID)
		require.Equal(t, 0, page.testid("outcome-form").Length(), "failed is confirmed already")
		rel := page.testid("release-form")
		require.Equal(t, 1, rel.Length())
		res := b.post("/operations/"+a.OperationID+"/release", url.Values{
			"operation_id":  {rel.Find(`input[name="operation_id"]`).AttrOr("value", "")},
			"fencing_token": {rel.Find(`input[name="fencing_token"]`).AttrOr("value", "")},
			"reason":        {"declined by the bank; let the retry run"}, "confirm": {"yes"}, "_csrf": {page.csrf(t)}})
		require.Equal(t, http.StatusSeeOther, res.status, res.body)
		page = b.get(res.header.Get("Location"))
		require.Equal(t, "Key released.", opSelText(page.testid("flash")))
		require.Equal(t, services.StateReleased, page.testid("op-state").AttrOr("data-state", ""))
		require.Equal(t, "No", opSelText(page.testid("op-held")))
		require.Equal(t, 0, page.testid("release-form").Length())

		k, err := f.s.reads.GetKey(ctx, f.pA.TenantID, "refund-1")
		require.NoError(t, err)
		require.False(t, k.Held)
		ev := f.opDetail(t, f.pA, a.OperationID).Events
		require.Equal(t, services.EventReleased, ev[len(ev)-1].Kind)
		require.Equal(t, f.restricted, ev[len(ev)-1].Actor)

		// A ?done= value outside the fixed set shows nothing.
		page = b.get("/operations/" + a.OperationID + "?done=%3Cscript%3E")
		require.Equal(t, 0, page.testid("flash").Length())
	})
}

// TestDashboardOperationStaleRelease is issue 3's race through the form: the operator opens
// operation A's release form, A's hold expires and attempt B acquires the key, the operator
// submits — the page names B and B's hold is intact.
func TestDashboardOperationStaleRelease(t *testing.T) {
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		ctx := context.Background()
		a := f.opAcquire(t, f.pA, "race-key", 1, "attempt-a")

		b := newDashBrowser(t, f.s)
		b.mustLogin(f.restricted)
		page := b.get("/operations/" + a.OperationID)
		rel := page.testid("release-form")
		require.Equal(t, 1, rel.Length())
		form := url.Values{
			"operation_id":  {rel.Find(`input[name="operation_id"]`).AttrOr("value", "")},
			"fencing_token": {rel.Find(`input[name="fencing_token"]`).AttrOr("value", "")},
			"reason":        {"worker looks stuck"}, "confirm": {"yes"}, "_csrf": {page.csrf(t)},
		}

		elapse(t, f.db, f.pA, time.Second, "race-key")
		bAcq := f.opAcquire(t, f.pA, "race-key", 300, "attempt-b")
		require.EqualValues(t, 2, bAcq.FencingToken)

		res := b.post("/operations/"+a.OperationID+"/release", form)
		require.Equal(t, http.StatusConflict, res.status, res.body)
		require.Equal(t, "Not released: the key is now held by operation "+bAcq.OperationID+
			" (fencing token 2, attempt attempt-b). Nothing was changed.", opSelText(res.testid("action-error")))
		require.Equal(t, 0, res.testid("release-form").Length(), "A no longer holds the key")
		require.Contains(t, opSelText(res.testid("op-holder")), bAcq.OperationID)
		require.Equal(t, 2, res.testid("generation-row").Length())

		k, err := f.s.reads.GetKey(ctx, f.pA.TenantID, "race-key")
		require.NoError(t, err)
		require.True(t, k.Held)
		require.Equal(t, bAcq.OperationID, k.Operation.ID)
		require.Equal(t, services.StateInProgress, k.Operation.State)
		require.Empty(t, f.opDetail(t, f.pA, bAcq.OperationID).Events, "nothing happened to B")
		for _, e := range f.opDetail(t, f.pA, a.OperationID).Events {
			require.NotEqual(t, services.EventReleased, e.Kind)
		}
	})
}

func TestDashboardOperationAuditorReadOnly(t *testing.T) {
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		a := f.opAcquire(t, f.pB, "audited", 300, "")

		b := newDashBrowser(t, f.s)
		b.mustLogin(f.global) // a global auditor
		page := b.get("/operations/" + a.OperationID)
		require.Equal(t, http.StatusOK, page.status)
		require.Equal(t, "audited", opSelText(page.testid("op-key")))
		for _, id := range []string{"outcome-form", "outcome-submit", "release-form", "release-submit", "release-confirm"} {
			require.Equal(t, 0, page.testid(id).Length(), id)
		}
		require.Equal(t, 0, page.doc.Find(`form[action^="/operations/"]`).Length())

		// Hand-crafted POSTs with a valid CSRF token are refused.
		token := page.csrf(t)
		for path, form := range map[string]url.Values{
			"/outcome": {"status": {"failed"}, "note": {"n"}, "_csrf": {token}},
			"/release": {"operation_id": {a.OperationID}, "fencing_token": {"1"}, "reason": {"r"}, "confirm": {"yes"},
				"_csrf": {token}},
		} {
			res := b.post("/operations/"+a.OperationID+path, form)
			require.Equal(t, http.StatusForbidden, res.status, path)
			require.Equal(t, "403", res.testid("error-status").Text())
		}
		d := f.opDetail(t, f.pB, a.OperationID)
		require.Equal(t, services.StateInProgress, d.State)
		require.True(t, d.Held)
		require.Nil(t, d.Outcome)
		require.Empty(t, d.Events)
	})
}

func TestDashboardOperationTenantScope(t *testing.T) {
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		other := f.opAcquire(t, f.pB, "b-secret", 300, "")
		own := f.opAcquire(t, f.pA, "a-own", 300, "")

		b := newDashBrowser(t, f.s)
		b.mustLogin(f.restricted) // an operator of tenant A
		res := b.get("/operations/" + other.OperationID)
		require.Equal(t, http.StatusNotFound, res.status)
		require.NotContains(t, res.body, "b-secret")
		token := b.get("/operations/" + own.OperationID).csrf(t)
		for path, form := range map[string]url.Values{
			"/outcome": {"status": {"failed"}, "note": {"n"}, "_csrf": {token}},
			"/release": {"operation_id": {other.OperationID}, "fencing_token": {"1"}, "reason": {"r"}, "confirm": {"yes"},
				"_csrf": {token}},
		} {
			res := b.post("/operations/"+other.OperationID+path, form)
			require.Equal(t, http.StatusNotFound, res.status, path)
		}
		d := f.opDetail(t, f.pB, other.OperationID)
		require.Equal(t, services.StateInProgress, d.State)
		require.True(t, d.Held)
		require.Empty(t, d.Events)

		// A global operator acts on any tenant.
		global := dashOperator(t, f.db, services.RoleOperator, nil)
		g := newDashBrowser(t, f.s)
		g.mustLogin(global)
		page := g.get("/operations/" + other.OperationID)
		require.Equal(t, http.StatusOK, page.status)
		require.Equal(t, f.tenantB, opSelText(page.testid("op-tenant")))
		require.Equal(t, 1, page.testid("release-form").Length())
	})
}

func TestDashboardOperationValidation(t *testing.T) {
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		a := f.opAcquire(t, f.pA, "validate-me", 300, "")
		b := newDashBrowser(t, f.s)
		b.mustLogin(f.restricted)
		page := b.get("/operations/" + a.OperationID)
		token := page.csrf(t)
		release := func(extra url.Values) url.Values {
			v := url.Values{"operation_id": {a.OperationID}, "fencing_token": {"1"}, "reason": {"r"}, "confirm": {"yes"},
				"_csrf": {token}}
			for k, x := range extra {
				v[k] = x
			}
			return v
		}
		for _, c := range []struct {
			path string
			form url.Values
			want string
		}{
			{"/outcome", url.Values{"status": {"succeeded"}, "note": {""}, "_csrf": {token}}, "Note is required"},
			{"/outcome", url.Values{"status": {"succeeded"}, "note": {"   "}, "_csrf": {token}}, "Note is required"},
			{"/outcome", url.Values{"status": {"maybe"}, "note": {"n"}, "_csrf": {token}}, "Outcome must be succeeded or failed"},
			{"/release", release(url.Values{"reason": {""}}), "Reason is required"},
			{"/release", release(url.Values{"confirm": {""}}), "tick the confirmation box"},
			{"/release", release(url.Values{"fencing_token": {"x"}}), "Fencing token must be a positive integer"},
		} {
			res := b.post("/operations/"+a.OperationID+c.path, c.form)
			require.Equal(t, http.StatusBadRequest, res.status, c.want)
			msg := opSelText(res.testid("action-error"))
			require.Contains(t, msg, c.want)
			require.Contains(t, msg, "Nothing was changed.")
			requirePageHeaders(t, res)
		}
		// What the operator typed is kept in the re-rendered form.
		res := b.post("/operations/"+a.OperationID+"/outcome", url.Values{"status": {"failed"}, "receipt": {"r-1"},
			"note": {""}, "_csrf": {token}})
		require.Equal(t, "r-1", res.testid("outcome-form").Find(`input[name="receipt"]`).AttrOr("value", ""))
		require.Equal(t, "failed", res.testid("outcome-form").Find(`input[name="status"][checked]`).AttrOr("value", ""))

		d := f.opDetail(t, f.pA, a.OperationID)
		require.Equal(t, services.StateInProgress, d.State)
		require.True(t, d.Held)
		require.Nil(t, d.Outcome)
		require.Empty(t, d.Events)

		// Without the CSRF token: refused before anything else.
		res = b.post("/operations/"+a.OperationID+"/outcome", url.Values{"status": {"failed"}, "note": {"n"}})
		require.Equal(t, http.StatusForbidden, res.status)
		require.Nil(t, f.opDetail(t, f.pA, a.OperationID).Outcome)
	})
}

// A tenant-restricted auditor's POST to another tenant's operation answers 404, like its GET
// and like an unknown id: a 403 there would confirm the operation exists. Its own tenant's
// operations still answer 403 (read-only), so the tenant check comes before the role check.
func TestDashboardOperationAuditorOtherTenantIs404(t *testing.T) {
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		other := f.opAcquire(t, f.pB, "b-hidden", 300, "")
		own := f.opAcquire(t, f.pA, "a-visible", 300, "")
		auditor := dashOperator(t, f.db, services.RoleAuditor, &f.pA.TenantID)

		b := newDashBrowser(t, f.s)
		b.mustLogin(auditor)
		token := b.get("/operations/" + own.OperationID).csrf(t)
		forms := func(id string) map[string]url.Values {
			return map[string]url.Values{
				"/outcome": {"status": {"failed"}, "note": {"n"}, "_csrf": {token}},
				"/release": {"operation_id": {id}, "fencing_token": {"1"}, "reason": {"r"}, "confirm": {"yes"}, "_csrf": {token}},
			}
		}
		for _, id := range []string{other.OperationID, "00000000-0000-4000-8000-000000000000", "not-a-uuid"} {
			for path, form := range forms(id) {
				res := b.post("/operations/"+id+path, form)
				require.Equal(t, http.StatusNotFound, res.status, "%s%s", id, path)
				require.NotContains(t, res.body, "b-hidden")
			}
		}
		for path, form := range forms(own.OperationID) {
			res := b.post("/operations/"+own.OperationID+path, form)
			require.Equal(t, http.StatusForbidden, res.status, path)
		}
		d := f.opDetail(t, f.pB, other.OperationID)
		require.Equal(t, services.StateInProgress, d.State)
		require.Empty(t, d.Events)

		// The services keep the same order for any other caller.
		acct, err := f.s.auth.Login(context.Background(), auditor, dashPassword)
		require.NoError(t, err)
		_, err = f.s.recon.ReconcileOutcome(context.Background(), acct, other.OperationID,
			services.ReconcileInput{Status: services.StateFailed, Note: "n"})
		require.ErrorIs(t, err, services.ErrNotFound)
		_, err = f.s.recon.OperatorRelease(context.Background(), acct, other.OperationID,
			services.OperatorReleaseInput{OperationID: other.OperationID, FencingToken: 1, Reason: "r"})
		require.ErrorIs(t, err, services.ErrNotFound)
		_, err = f.s.recon.ReconcileOutcome(context.Background(), acct, own.OperationID,
			services.ReconcileInput{Status: services.StateFailed, Note: "n"})
		require.ErrorIs(t, err, services.ErrUnauthorized)
	})
}

// TestOperationPageBoundsNestedJSON: metadata nested thousands of levels deep (16 KiB of
// [[[…]]], accepted at acquire) is shown as stored, compact, instead of indented: indenting
// it wrote two spaces per level on every line, a page that grew with the square of the
// nesting (133 MB for this much, issue 28 item 5). Shallow JSON is still indented.
func TestOperationPageBoundsNestedJSON(t *testing.T) {
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		b := newDashBrowser(t, f.s)
		b.mustLogin(f.restricted)
		levels := (services.MaxMetadataBytes - 16) / 2
		deep := `{"x":` + strings.Repeat("[", levels) + strings.Repeat("]", levels) + `}`
		for _, tc := range []struct {
			metadata string
			want     string
		}{
			{deep, deep},
			{`{"a":{"b":[1,2]}}`, "{\n  \"a\": {\n    \"b\": [\n      1,\n      2\n    ]\n  }\n}"},
		} {
			a, err := f.s.adm.Acquire(context.Background(), f.pA, services.AcquireInput{Key: "nested-" + dashRandom(), TTLSeconds: 60,
				Metadata: json.RawMessage(tc.metadata)})
			require.NoError(t, err)
			page := b.get("/operations/" + a.OperationID)
			require.Equal(t, http.StatusOK, page.status)
			require.Less(t, len(page.body), 4*services.MaxMetadataBytes, "the page stays near the size of what it shows")
			require.Equal(t, tc.want, page.testid("op-metadata").Text())
		}
	})
}

// FuzzOpPrettyJSON: whatever is stored, the operation page's text for it is the same JSON
// (compacted, equal to the stored value compacted) and at most about 2×opIndentDepth+2 times
// its size, never the square of its nesting.
func FuzzOpPrettyJSON(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":[1,{"b":"c"}]}`, `[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]`, `"x"`, `{"a":"[[["}`, `[`, `not json`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		if len(raw) == 0 {
			return
		}
		out := opPrettyJSON(raw)
		require.LessOrEqual(t, len(out), (2*opIndentDepth+2)*len(raw)+1)
		if !json.Valid(raw) {
			return
		}
		var want, got bytes.Buffer
		require.NoError(t, json.Compact(&want, raw))
		require.NoError(t, json.Compact(&got, []byte(out)))
		require.Equal(t, want.String(), got.String())
	})
}

// TestDashboardOperationLifecycle: the operation page says what the operation was admitted
// under and until when its evidence is kept and its key protected (docs/reference.md §2
// "Lifecycle"); without a policy, that the installation's retention applies and the TTL alone
// protects the key.
func TestDashboardOperationLifecycle(t *testing.T) {
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		ctx := context.Background()
		retention, horizon := 30*24*time.Hour, 400*24*time.Hour
		_, err := f.s.policies.Set(ctx, services.Installation(), services.PolicyInput{Tenant: f.tenantA, Operation: "lifecycle",
			Retention: &retention, Horizon: &horizon})
		require.NoError(t, err)
		name := "lifecycle"
		a, err := f.s.adm.Acquire(ctx, f.pA, services.AcquireInput{Key: "life-1", TTLSeconds: 300, Operation: &name})
		require.NoError(t, err)
		plain := f.opAcquire(t, f.pA, "life-2", 300, "")

		b := newDashBrowser(t, f.s)
		b.mustLogin(f.restricted)
		page := b.get("/operations/" + a.OperationID)
		require.Equal(t, "30d 0h", opSelText(page.testid("op-retention")))
		require.Equal(t, "400d 0h after a success", opSelText(page.testid("op-horizon")))
		require.Zero(t, page.doc.Find("dt:contains('Key protected until (UTC)') + dd time").Length(), "in progress: not protected yet")
		require.Zero(t, page.doc.Find("dt:contains('Evidence kept until (UTC)') + dd time").Length(), "in progress: nothing to purge yet")

		_, err = f.s.adm.RecordOutcome(ctx, f.pA, a.OperationID, services.OutcomeInput{OwnerToken: a.OwnerToken,
			Status: services.StateSucceeded})
		require.NoError(t, err)
		page = b.get("/operations/" + a.OperationID)
		for _, label := range []string{"Evidence kept until (UTC)", "Key protected until (UTC)"} {
			dd := page.doc.Find("dt:contains('" + label + "') + dd time")
			require.Equal(t, 1, dd.Length(), label)
			at, err := time.Parse(time.RFC3339, dd.AttrOr("datetime", ""))
			require.NoError(t, err, label)
			want := map[string]time.Duration{"Evidence kept until (UTC)": retention, "Key protected until (UTC)": horizon}[label]
			require.WithinDuration(t, time.Now().Add(want), at, time.Hour, label)
		}

		page = b.get("/operations/" + plain.OperationID)
		require.Equal(t, "the installation's (IDEMGATE_RETENTION)", opSelText(page.testid("op-retention")))
		require.Equal(t, "none: the TTL alone protects the key", opSelText(page.testid("op-horizon")))
	})
}
