package web

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/PuerkitoBio/goquery"
	"github.com/google/uuid"
	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/services"
	"github.com/idemgate/idemgate/services/playback"
	"github.com/stretchr/testify/require"
)

// shownExchange is one request and answer as the Explore page prints them.
type shownExchange struct {
	method, target string
	reqHeader      http.Header
	reqBody        []byte
	status         int
	respHeader     http.Header
	respBody       []byte
}

// splitMessage cuts a printed HTTP message into its first line, headers and body.
func splitMessage(t *testing.T, text string) (string, http.Header, []byte) {
	t.Helper()
	head, body, _ := strings.Cut(text, "\n\n")
	lines := strings.Split(head, "\n")
	h := http.Header{}
	for _, l := range lines[1:] {
		name, value, ok := strings.Cut(l, ": ")
		require.True(t, ok, "header line %q in %q", l, text)
		h.Add(name, value)
	}
	return lines[0], h, []byte(body)
}

// shownExchanges reads the exchanges of step n from the page.
func shownExchanges(t *testing.T, p dashPage, n int) []shownExchange {
	t.Helper()
	step := p.testid("explore-step-" + strconv.Itoa(n))
	require.Equal(t, 1, step.Length(), "step %d on the page:\n%s", n, p.body)
	var out []shownExchange
	step.Find(`[data-testid="explore-exchange"]`).Each(func(_ int, s *goquery.Selection) {
		line, rh, rb := splitMessage(t, s.Find(`[data-testid="explore-request"]`).Text())
		method, target, _ := strings.Cut(line, " ")
		sline, ah, ab := splitMessage(t, s.Find(`[data-testid="explore-answer"]`).Text())
		code, _, _ := strings.Cut(sline, " ")
		status, err := strconv.Atoi(code)
		require.NoError(t, err, sline)
		attr, _ := s.Find(`[data-testid="explore-answer"]`).Attr("data-status")
		require.Equal(t, code, attr)
		out = append(out, shownExchange{method: method, target: target, reqHeader: rh, reqBody: rb, status: status,
			respHeader: ah, respBody: ab})
	})
	return out
}

func jsonMembers(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m), "%s", b)
	return m
}

// TestExplorePlaysTheKeysLife walks the playback as a browser without JavaScript does (the
// forms and their 303s), as an auditor, on both databases, and checks:
//   - every step answers as docs/reference.md says (201, 200 duplicate, 422, uncertain in the
//     queue, 201 with previous_operation, the stored outcome, 409 not_owner, reconciled);
//   - every request and answer shown for the JSON API matches openapi.json, so the page shows
//     the API's wire format and not a look-alike;
//   - nothing of the playback reaches the deployment's database (no sandbox tenant, no key).
func TestExplorePlaysTheKeysLife(t *testing.T) {
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		b := newDashBrowser(t, f.s)
		b.mustLogin(f.global) // an auditor: Explore is for every role

		start := b.get("/explore")
		require.Equal(t, http.StatusOK, start.status, start.body)
		requirePageHeaders(t, start)
		require.Equal(t, 1, start.testid("nav-explore").Length())
		cur, _ := start.testid("nav-explore").Attr("aria-current")
		require.Equal(t, "page", cur)
		require.Contains(t, start.testid("explore-sandbox").Text(), "Sandbox")
		require.Zero(t, start.testid("explore-tenant").Length(), "no tenant before step 1")
		require.Equal(t, "Not started: press Next step", strings.TrimSpace(start.testid("explore-progress").Text()))
		require.Equal(t, playback.Steps, start.testid("explore-upcoming").Find("li").Length())
		id, ok := start.doc.Find(`form[action="/explore/next"] input[name="playback"]`).Attr("value")
		require.True(t, ok)

		page := start
		var key, tenant string
		shown := map[int][]shownExchange{}
		for n := 1; n <= playback.Steps; n++ {
			res := b.post("/explore/next", url.Values{"_csrf": {page.csrf(t)}, "playback": {id}, "step": {strconv.Itoa(n - 1)}})
			require.Equal(t, http.StatusSeeOther, res.status, res.body)
			loc := res.header.Get("Location")
			require.Equal(t, exploreLocation(id, n), loc)
			page = b.get(strings.Split(loc, "#")[0])
			require.Equal(t, http.StatusOK, page.status, page.body)
			require.Equal(t, "Step "+strconv.Itoa(n)+" of 8", strings.TrimSpace(page.testid("explore-progress").Text()))
			require.Equal(t, n, page.testid("explore-steps").Children().Length())
			require.NotEmpty(t, strings.TrimSpace(page.testid("explore-step-"+strconv.Itoa(n)).Find(`[data-testid="explore-why"]`).Text()))
			require.Zero(t, page.testid("explore-restarted").Length(), "a playback walked in one process never restarts")
			if key == "" {
				key = strings.TrimSpace(page.testid("explore-key").Text())
				require.True(t, strings.HasPrefix(key, "charge:order-"), key)
				tenant = strings.TrimSpace(page.testid("explore-tenant").Text())
				require.True(t, strings.HasPrefix(tenant, playback.TenantPrefix), tenant)
			}
			require.Equal(t, key, strings.TrimSpace(page.testid("explore-key").Text()), "one key for the whole playback")
			require.Equal(t, tenant, strings.TrimSpace(page.testid("explore-tenant").Text()), "one tenant for the whole playback")
			shown[n] = shownExchanges(t, page, n)
		}
		require.Equal(t, 1, page.testid("explore-done").Length())
		require.Zero(t, page.testid("explore-next").Length())

		statuses := func(n int) []int {
			var s []int
			for _, x := range shown[n] {
				s = append(s, x.status)
			}
			return s
		}
		require.Equal(t, []int{201}, statuses(1))
		first := jsonMembers(t, shown[1][0].respBody)
		require.EqualValues(t, 1, first["fencing_token"])
		require.NotEmpty(t, first["owner_token"])
		require.Equal(t, []int{200}, statuses(2))
		dup := jsonMembers(t, shown[2][0].respBody)
		require.Equal(t, false, dup["admitted"])
		require.Equal(t, first["operation_id"], dup["operation"].(map[string]any)["id"], "the duplicate names the holder")
		require.Equal(t, []int{422}, statuses(3))
		require.Equal(t, services.CodeFingerprintMismatch, jsonMembers(t, shown[3][0].respBody)["code"])
		require.Equal(t, 1, page.testid("explore-step-4").Find(`[data-testid="explore-note"]`).Length(), "the clock moves")
		require.Equal(t, []int{200}, statuses(4))
		require.Contains(t, string(shown[4][0].respBody), first["operation_id"].(string), "uncertain, in the queue")
		require.Equal(t, []int{201}, statuses(5))
		second := jsonMembers(t, shown[5][0].respBody)
		require.EqualValues(t, 2, second["fencing_token"])
		prev := second["previous_operation"].(map[string]any)
		require.Equal(t, first["operation_id"], prev["id"])
		require.Equal(t, services.StateUncertain, prev["state"])
		require.Equal(t, []int{200, 200}, statuses(6))
		require.Contains(t, string(shown[6][1].respBody), `"receipt": "ch_`, "a duplicate gets the stored outcome")
		require.Equal(t, []int{409}, statuses(7))
		require.Equal(t, services.CodeNotOwner, jsonMembers(t, shown[7][0].respBody)["code"])
		require.Equal(t, []int{303, 200, 200}, statuses(8))
		reconciled := jsonMembers(t, shown[8][1].respBody)
		require.Equal(t, services.StateFailed, reconciled["state"])
		require.Equal(t, playback.SandboxOperator, reconciled["outcome"].(map[string]any)["recorded_by"],
			"an auditor watches an operator act; nothing is recorded in a read-only account's name")
		require.Contains(t, shown[8][0].reqHeader.Get("Cookie"), "operator")
		require.Equal(t, []any{}, jsonMembers(t, shown[8][2].respBody)["items"], "the queue is empty again")

		// The timeline after the last step: generation 1 reconciled failed, 2 succeeded.
		var states []string
		page.testid("explore-step-8").Find(`[data-testid="explore-generation"] [data-testid="state-badge"]`).Each(
			func(_ int, s *goquery.Selection) {
				st, _ := s.Attr("data-state")
				states = append(states, st)
			})
		require.Equal(t, []string{services.StateFailed, services.StateSucceeded}, states)

		// Every JSON API exchange shown matches the API's own description.
		for n := 1; n <= playback.Steps; n++ {
			for _, x := range shown[n] {
				if !strings.HasPrefix(x.target, "/v1/") {
					continue // step 8's dashboard form
				}
				h := x.reqHeader.Clone()
				h.Set("Authorization", "Bearer "+strings.Repeat("k", 32))
				checkContract(t, exchange{method: x.method, target: x.target, header: h, body: x.reqBody, status: x.status,
					respHeader: x.respHeader, respBody: x.respBody})
			}
		}

		// Nothing reached the deployment's database.
		requireNoSandboxIn(t, f.db, tenant)

		// The same acquire, sent to the real API, answers with the same members.
		c := newTenantClient(t, f.s)
		real := c.do(http.MethodPost, "/v1/acquire", shown[1][0].reqBody)
		require.Equal(t, http.StatusCreated, real.status, real.raw)
		require.ElementsMatch(t, mapKeys(real.body), mapKeys(first))

		// Reset starts a new playback on a new key.
		res := b.post("/explore/reset", url.Values{"_csrf": {page.csrf(t)}})
		require.Equal(t, http.StatusSeeOther, res.status)
		require.Equal(t, "/explore", res.header.Get("Location"))
		again := b.get("/explore")
		id2, _ := again.doc.Find(`form[action="/explore/next"] input[name="playback"]`).Attr("value")
		require.NotEqual(t, id, id2)
		res = b.post("/explore/next", url.Values{"_csrf": {again.csrf(t)}, "playback": {id2}, "step": {"0"}})
		require.Equal(t, http.StatusSeeOther, res.status)
		one := b.get(strings.Split(res.header.Get("Location"), "#")[0])
		require.NotEqual(t, tenant, strings.TrimSpace(one.testid("explore-tenant").Text()), "a new playback, a new tenant")
	})
}

func mapKeys(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// requireNoSandboxIn fails if the playback of tenant left anything in the deployment's
// database: its tenant, or any tenant of the sandbox.
func requireNoSandboxIn(t *testing.T, db *models.DB, tenant string) {
	t.Helper()
	var n int64
	require.NoError(t, db.Model(&models.Tenant{}).Where("name = ? OR name LIKE ?", tenant, playback.TenantPrefix+"%").Count(&n).Error)
	require.Zero(t, n, "a sandbox tenant in the deployment's database")
}

// TestExploreRefusesBadInput: a malformed playback id or step is a 400 page that says which,
// a form without its CSRF token is refused, and signed out the page asks to sign in.
func TestExploreRefusesBadInput(t *testing.T) {
	db := dbs.SQLite
	s := newTestServer(t, db)
	b := newDashBrowser(t, s)
	out := b.get("/explore")
	require.Equal(t, http.StatusSeeOther, out.status)
	require.Contains(t, out.header.Get("Location"), "/login")

	b.mustLogin(dashOperator(t, db, services.RoleAuditor, nil))
	for _, target := range []string{"/explore?playback=nope", "/explore?step=9", "/explore?step=-1",
		"/explore?playback=" + uuid.NewString() + "&step=x"} {
		p := b.get(target)
		require.Equal(t, http.StatusBadRequest, p.status, target)
		require.Contains(t, p.body, "must be", target)
	}
	page := b.get("/explore")
	csrf := page.csrf(t)
	for _, form := range []url.Values{
		{"_csrf": {csrf}, "step": {"0"}},
		{"_csrf": {csrf}, "playback": {"{" + uuid.NewString() + "}"}, "step": {"0"}},
		{"_csrf": {csrf}, "playback": {uuid.NewString()}, "step": {"8x"}},
	} {
		p := b.post("/explore/next", form)
		require.Equal(t, http.StatusBadRequest, p.status, form.Encode())
	}
	p := b.post("/explore/next", url.Values{"playback": {uuid.NewString()}, "step": {"0"}})
	require.Equal(t, http.StatusForbidden, p.status, "no CSRF token")
	// The last step asked again shows step 8 and plays nothing more.
	id := uuid.NewString()
	p = b.post("/explore/next", url.Values{"_csrf": {csrf}, "playback": {id}, "step": {"8"}})
	require.Equal(t, http.StatusSeeOther, p.status)
	require.Equal(t, exploreLocation(id, 8), p.header.Get("Location"))
}

// TestExploreSurvivesAnotherInstance: a playback page asked of a server that never played it
// (the operator's next click reached another instance, or this one restarted) plays the steps
// on that server and says so, instead of failing or showing another story.
func TestExploreSurvivesAnotherInstance(t *testing.T) {
	db := dbs.SQLite
	a, other := newTestServer(t, db), newTestServer(t, db)
	op := dashOperator(t, db, services.RoleOperator, nil)
	ba := newDashBrowser(t, a)
	ba.mustLogin(op)
	page := ba.get("/explore")
	id, _ := page.doc.Find(`form[action="/explore/next"] input[name="playback"]`).Attr("value")
	for n := 0; n < 3; n++ {
		res := ba.post("/explore/next", url.Values{"_csrf": {page.csrf(t)}, "playback": {id}, "step": {strconv.Itoa(n)}})
		require.Equal(t, http.StatusSeeOther, res.status)
		page = ba.get(strings.Split(res.header.Get("Location"), "#")[0])
	}
	// The same session (sessions live in the database) on the other instance.
	bo := newDashBrowser(t, other)
	bo.cookies = ba.cookies
	res := bo.post("/explore/next", url.Values{"_csrf": {page.csrf(t)}, "playback": {id}, "step": {"3"}})
	require.Equal(t, http.StatusSeeOther, res.status, res.body)
	moved := bo.get(strings.Split(res.header.Get("Location"), "#")[0])
	require.Equal(t, http.StatusOK, moved.status)
	require.Equal(t, 1, moved.testid("explore-restarted").Length())
	require.Equal(t, 4, moved.testid("explore-steps").Children().Length())
	require.Equal(t, []int{200}, func() (s []int) {
		for _, x := range shownExchanges(t, moved, 2) {
			s = append(s, x.status)
		}
		return s
	}(), "step 2 is still the duplicate")
}

// FuzzParseExploreState: whatever a URL or form carries, the parser refuses it with a field
// error or accepts a canonical UUID and a step from 0 to playback.Steps, and the page's own
// address for that state parses back to it.
func FuzzParseExploreState(f *testing.F) {
	f.Add("", "", false)
	f.Add(uuid.NewString(), "3", true)
	f.Add(strings.ToUpper(uuid.NewString()), "08", true)
	f.Add("urn:uuid:"+uuid.NewString(), "1", true)
	f.Add("{"+uuid.NewString()+"}", "+1", false)
	f.Add(uuid.NewString(), "99999999999999999999", false)
	f.Add(uuid.NewString(), " 1", false)
	f.Fuzz(func(t *testing.T, id, step string, required bool) {
		got, n, de := parseExploreState(id, step, required)
		if de != nil {
			if de.Code != services.CodeInvalidRequest || len(de.Fields) == 0 {
				t.Fatalf("refusal %+v", de)
			}
			return
		}
		if n < 0 || n > playback.Steps {
			t.Fatalf("step %d accepted from %q", n, step)
		}
		if got == "" {
			if id != "" || required {
				t.Fatalf("id %q (required %v) accepted as none", id, required)
			}
			return
		}
		if u, err := uuid.Parse(got); err != nil || u.String() != got {
			t.Fatalf("id %q accepted as %q", id, got)
		}
		loc, err := url.Parse(exploreLocation(got, n))
		if err != nil {
			t.Fatal(err)
		}
		q := loc.Query()
		again, m, de := parseExploreState(q.Get("playback"), q.Get("step"), true)
		if de != nil || again != got || m != n {
			t.Fatalf("%s parsed back as %q %d %v", loc, again, m, de)
		}
	})
}

// TestExploreSandboxFailureIsAPage: when the sandbox cannot play (here the server is shutting
// down and its Player closed), Explore answers 503 with the site's HTML page and navigation,
// and the rest of the dashboard is unaffected.
func TestExploreSandboxFailureIsAPage(t *testing.T) {
	db := dbs.SQLite
	s := newTestServer(t, db)
	b := newDashBrowser(t, s)
	tenantID := dashTenantID(t, s)
	b.mustLogin(dashOperator(t, db, services.RoleOperator, &tenantID))
	require.NoError(t, s.player.Close())
	p := b.get("/explore?playback=" + uuid.NewString() + "&step=1")
	require.Equal(t, http.StatusServiceUnavailable, p.status, p.body)
	require.Equal(t, "text/html; charset=utf-8", p.header.Get("Content-Type"))
	require.Equal(t, 1, p.testid("nav-explore").Length(), "the site's navigation")
	require.Equal(t, http.StatusOK, b.get("/keys").status)
}

func dashTenantID(t *testing.T, s *Server) int64 {
	t.Helper()
	_, p := dashTenant(t, s)
	return p.TenantID
}
