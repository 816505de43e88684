package web

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"
	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/services"
	"github.com/idemgate/idemgate/static"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"
)

// Helpers here are prefixed "dash" so they never collide with the API tests of this package.

const dashPassword = "correct-horse-battery"

// dashBrowser is a browser without JavaScript talking to one in-process server: it keeps
// cookies, does not follow redirects, and parses every answer as HTML.
type dashBrowser struct {
	t       *testing.T
	s       *Server
	cookies map[string]*http.Cookie
}

func newDashBrowser(t *testing.T, s *Server) *dashBrowser {
	return &dashBrowser{t: t, s: s, cookies: map[string]*http.Cookie{}}
}

type dashPage struct {
	status int
	header http.Header
	body   string
	doc    *goquery.Document
	// setCookies are the cookies this answer set, by name.
	setCookies map[string]*http.Cookie
}

func (b *dashBrowser) do(req *http.Request) dashPage {
	req.Header.Set("Accept", "text/html,application/xhtml+xml;q=0.9,*/*;q=0.8") // as a browser sends
	b.t.Helper()
	for _, c := range b.cookies {
		req.AddCookie(&http.Cookie{Name: c.Name, Value: c.Value})
	}
	resp, err := b.s.app.Test(req, -1)
	require.NoError(b.t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(b.t, err)
	p := dashPage{status: resp.StatusCode, header: resp.Header, body: string(raw), setCookies: map[string]*http.Cookie{}}
	p.doc, err = goquery.NewDocumentFromReader(strings.NewReader(p.body))
	require.NoError(b.t, err)
	for _, c := range resp.Cookies() {
		p.setCookies[c.Name] = c
		if c.MaxAge < 0 || (!c.Expires.IsZero() && c.Expires.Before(time.Now())) || c.Value == "" {
			delete(b.cookies, c.Name)
		} else {
			b.cookies[c.Name] = c
		}
	}
	return p
}

func (b *dashBrowser) get(path string) dashPage {
	b.t.Helper()
	return b.do(httptest.NewRequest(http.MethodGet, path, nil))
}

func (b *dashBrowser) post(path string, form url.Values) dashPage {
	b.t.Helper()
	req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return b.do(req)
}

// csrf returns the CSRF token of the page's first form.
func (p dashPage) csrf(t *testing.T) string {
	t.Helper()
	v, ok := p.doc.Find(`input[name="_csrf"]`).First().Attr("value")
	require.True(t, ok, "no _csrf field in:\n%s", p.body)
	require.NotEmpty(t, v)
	return v
}

// testid returns the elements with data-testid id.
func (p dashPage) testid(id string) *goquery.Selection {
	return p.doc.Find(`[data-testid="` + id + `"]`)
}

// login signs in through the real form and returns the answer to the POST.
func (b *dashBrowser) login(username, password string) dashPage {
	b.t.Helper()
	form := b.get("/login")
	require.Equal(b.t, http.StatusOK, form.status)
	return b.post("/login", url.Values{"username": {username}, "password": {password}, "_csrf": {form.csrf(b.t)}})
}

// mustLogin signs in and asserts it worked.
func (b *dashBrowser) mustLogin(username string) {
	b.t.Helper()
	res := b.login(username, dashPassword)
	require.Equal(b.t, http.StatusSeeOther, res.status, res.body)
	require.Equal(b.t, "/", res.header.Get("Location"), "sign-in lands on the overview")
}

// dashRow is one row of the Keys table.
type dashRow struct {
	key, tenant, operation, state, fencing, ttl, acquired, duplicates string
}

func (p dashPage) rows() []dashRow {
	var out []dashRow
	p.testid("key-row").Each(func(_ int, s *goquery.Selection) {
		cell := func(id string) string { return strings.TrimSpace(s.Find(`[data-testid="` + id + `"]`).Text()) }
		state, _ := s.Find(`[data-testid="state-badge"]`).Attr("data-state")
		out = append(out, dashRow{
			key: s.Find(`[data-testid="key-name"]`).Text(), tenant: cell("key-tenant"), operation: cell("key-operation"),
			state: state, fencing: cell("key-fencing"), ttl: cell("key-ttl"), acquired: cell("key-acquired"),
			duplicates: strings.TrimSpace(s.Find(`[data-testid="key-duplicates"]`).Contents().First().Text()),
		})
	})
	return out
}

func dashKeys(rows []dashRow) []string {
	out := make([]string, 0, len(rows))
	for _, r := range rows {
		out = append(out, r.key)
	}
	return out
}

// dashFixture is one test's world on one database: a server, two tenants with API
// principals, a global and a tenant-A-restricted operator, and an operation name unique to the
// test so that listings can be narrowed to this test's keys on the shared database.
type dashFixture struct {
	s          *Server
	db         *models.DB
	tenantA    string
	tenantB    string
	pA, pB     services.Principal
	op         string
	global     string
	restricted string
}

func dashRandom() string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// dashEachDB runs fn on PostgreSQL and on SQLite.
func dashEachDB(t *testing.T, fn func(t *testing.T, f *dashFixture)) {
	dbs.Each(t, func(t *testing.T, db *models.DB) {
		s := newTestServer(t, db)
		f := &dashFixture{s: s, db: db, op: "dash-" + dashRandom()}
		f.tenantA, f.pA = dashTenant(t, s)
		f.tenantB, f.pB = dashTenant(t, s)
		f.global = dashOperator(t, db, services.RoleAuditor, nil)
		f.restricted = dashOperator(t, db, services.RoleOperator, &f.pA.TenantID)
		fn(t, f)
	})
}

// dashTenant creates a tenant with an API key and returns its name and principal.
func dashTenant(t *testing.T, s *Server) (string, services.Principal) {
	t.Helper()
	ctx := context.Background()
	name := "dash-tenant-" + dashRandom()
	secret, err := s.accounts.CreateAPIKey(ctx, services.Installation(), name, "dashboard test", "")
	require.NoError(t, err)
	p, err := s.auth.Authenticate(ctx, secret)
	require.NoError(t, err)
	return name, p
}

// dashOperator stores an operator whose password is dashPassword and returns the username. The
// hash uses bcrypt's minimum cost so the tests stay fast; Login reads the cost from the hash.
func dashOperator(t *testing.T, db *models.DB, role string, tenantID *int64) string {
	t.Helper()
	hash, err := bcrypt.GenerateFromPassword([]byte(dashPassword), bcrypt.MinCost)
	require.NoError(t, err)
	op := models.Operator{Username: "op-" + dashRandom(), PasswordHash: string(hash), Role: role, TenantID: tenantID,
		CreatedAt: time.Now().UTC()}
	require.NoError(t, db.Create(&op).Error)
	return op.Username
}

func (f *dashFixture) acquire(t *testing.T, p services.Principal, key string) *services.Acquisition {
	t.Helper()
	op := f.op
	a, err := f.s.adm.Acquire(context.Background(), p, services.AcquireInput{Key: key, TTLSeconds: 300, Operation: &op})
	require.NoError(t, err)
	return a
}

// keysURL is the Keys page narrowed to this test's operation.
func (f *dashFixture) keysURL(extra string) string {
	u := "/keys?operation=" + url.QueryEscape(f.op)
	if extra != "" {
		u += "&" + extra
	}
	return u
}

func requirePageHeaders(t *testing.T, p dashPage) {
	t.Helper()
	csp := p.header.Get("Content-Security-Policy")
	require.Contains(t, csp, "default-src 'self'")
	require.Contains(t, csp, "frame-ancestors 'none'")
	require.NotContains(t, csp, "unsafe-inline")
	require.NotContains(t, csp, "unsafe-eval")
	require.Equal(t, "nosniff", p.header.Get("X-Content-Type-Options"))
	require.Equal(t, "same-origin", p.header.Get("Referrer-Policy"))
	require.Equal(t, "no-store", p.header.Get("Cache-Control"))
	require.Equal(t, "text/html; charset=utf-8", p.header.Get("Content-Type"))
}

func TestDashboardRedirectsWhenSignedOut(t *testing.T) {
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		b := newDashBrowser(t, f.s)
		res := b.get("/keys")
		require.Equal(t, http.StatusSeeOther, res.status)
		require.Equal(t, "/login?next=%2Fkeys", res.header.Get("Location"))

		res = b.get("/keys?state=uncertain")
		require.Equal(t, "/login?next="+url.QueryEscape("/keys?state=uncertain"), res.header.Get("Location"))

		res = b.get("/")
		require.Equal(t, http.StatusSeeOther, res.status)
		require.Equal(t, "/login", res.header.Get("Location"))

		res = b.post("/logout", url.Values{})
		require.Equal(t, http.StatusSeeOther, res.status)
		require.Equal(t, "/login", res.header.Get("Location"))

		// The sign-in page itself is public, with a CSRF token and the security headers.
		login := b.get("/login")
		require.Equal(t, http.StatusOK, login.status)
		requirePageHeaders(t, login)
		require.Equal(t, 1, login.testid("login-form").Length())
		login.csrf(t)
		csrfCookie := login.setCookies["idemgate_csrf"]
		require.NotNil(t, csrfCookie)
		require.True(t, csrfCookie.HttpOnly)
		// No inline script anywhere: every <script> has a src.
		login.doc.Find("script").Each(func(_ int, s *goquery.Selection) {
			src, ok := s.Attr("src")
			require.True(t, ok && strings.HasPrefix(src, "/static/"), "inline script: %s", s.Text())
		})
	})
}

func TestDashboardLoginShowsKeys(t *testing.T) {
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		const xss = `<script>alert(1)</script>`
		f.acquire(t, f.pA, "order-1")
		f.acquire(t, f.pA, xss)
		f.acquire(t, f.pA, "order-1") // a duplicate attempt
		f.acquire(t, f.pB, "other-tenant-key")

		b := newDashBrowser(t, f.s)
		form := b.get("/login")
		before := b.cookies["idemgate_session"]
		require.NotNil(t, before, "the sign-in form's session holds its CSRF token")
		res := b.post("/login", url.Values{"username": {f.restricted}, "password": {dashPassword}, "_csrf": {form.csrf(t)}})
		require.Equal(t, http.StatusSeeOther, res.status, res.body)
		require.Equal(t, "/", res.header.Get("Location"))
		sess := res.setCookies["idemgate_session"]
		require.NotNil(t, sess)
		require.True(t, sess.HttpOnly)
		require.Equal(t, http.SameSiteLaxMode, sess.SameSite)
		require.NotEqual(t, before.Value, sess.Value, "the session id must change on sign-in")
		// The pre-login session is gone from the store: a fixated id is worthless.
		data, err := services.NewSessionStore(f.db).Get(before.Value)
		require.NoError(t, err)
		require.Nil(t, data)

		page := b.get(f.keysURL(""))
		require.Equal(t, http.StatusOK, page.status, page.body)
		requirePageHeaders(t, page)
		require.Equal(t, f.restricted, page.testid("account-username").Text())
		require.Contains(t, page.testid("keys-scope").Text(), "Tenant "+f.tenantA)
		rows := page.rows()
		require.Equal(t, []string{xss, "order-1"}, dashKeys(rows), "newest first, own tenant only")
		// The hostile key is text, not markup.
		require.NotContains(t, page.body, xss)
		require.Contains(t, page.body, "&lt;script&gt;alert(1)&lt;/script&gt;")
		page.doc.Find("script").Each(func(_ int, s *goquery.Selection) {
			_, ok := s.Attr("src")
			require.True(t, ok, "inline script element rendered")
		})
		order := rows[1]
		require.Equal(t, f.op, order.operation)
		require.Equal(t, services.StateInProgress, order.state)
		require.Equal(t, "1", order.fencing)
		require.Equal(t, "1", order.duplicates)
		require.Regexp(t, regexp.MustCompile(`^[45]m \d\ds$`), order.ttl)
		require.Regexp(t, regexp.MustCompile(`^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$`), order.acquired)
		require.Equal(t, "0", rows[0].duplicates)
		require.Equal(t, 0, page.testid("key-tenant").Length(), "no tenant column for a restricted account")
		require.Contains(t, page.testid("state-badge").First().Text(), "In progress", "state has a text label")

		// Signed in, / and /login lead to the Overview.
		res = b.get("/")
		require.Equal(t, http.StatusOK, res.status, "/ is the Overview")
		require.Equal(t, 1, res.testid("overview-needs-reconciliation").Length())
		res = b.get("/login")
		require.Equal(t, http.StatusSeeOther, res.status)
		require.Equal(t, "/", res.header.Get("Location"))
	})
}

func TestDashboardLoginReturnsToRequestedPage(t *testing.T) {
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		b := newDashBrowser(t, f.s)
		res := b.get("/keys?state=uncertain")
		loginURL := res.header.Get("Location")
		form := b.get(loginURL)
		require.Equal(t, "/keys?state=uncertain", form.doc.Find(`input[name="next"]`).AttrOr("value", ""))
		res = b.post("/login", url.Values{"username": {f.global}, "password": {dashPassword},
			"_csrf": {form.csrf(t)}, "next": {"/keys?state=uncertain"}})
		require.Equal(t, http.StatusSeeOther, res.status)
		require.Equal(t, "/keys?state=uncertain", res.header.Get("Location"))

		// An off-site "next" is ignored.
		b2 := newDashBrowser(t, f.s)
		form = b2.get("/login?next=//evil.example/")
		require.Equal(t, 0, form.doc.Find(`input[name="next"]`).Length())
		res = b2.post("/login", url.Values{"username": {f.global}, "password": {dashPassword},
			"_csrf": {form.csrf(t)}, "next": {"//evil.example/"}})
		require.Equal(t, "/", res.header.Get("Location"))
	})
}

func TestDashboardLoginBadPassword(t *testing.T) {
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		b := newDashBrowser(t, f.s)
		res := b.login(f.restricted, "wrong-password-123")
		require.Equal(t, http.StatusUnauthorized, res.status)
		anonymous := b.cookies["idemgate_session"]
		requirePageHeaders(t, res)
		wrongPassword := strings.TrimSpace(res.testid("login-error").Text())
		require.Equal(t, "Incorrect username or password.", wrongPassword)
		require.Equal(t, f.restricted, res.testid("login-username").AttrOr("value", ""), "the username is kept")
		require.Empty(t, res.testid("login-password").AttrOr("value", ""), "the password is never echoed")
		require.NotContains(t, res.body, "wrong-password-123")
		// Nobody is signed in: the browser keeps only its anonymous form session.
		require.Equal(t, http.StatusSeeOther, b.get("/keys").status)
		require.Equal(t, anonymous.Value, b.cookies["idemgate_session"].Value)

		// An unknown user gets exactly the same answer.
		b2 := newDashBrowser(t, f.s)
		unknown := b2.login("nobody-"+dashRandom(), "wrong-password-123")
		require.Equal(t, http.StatusUnauthorized, unknown.status)
		require.Equal(t, wrongPassword, strings.TrimSpace(unknown.testid("login-error").Text()))

		// Retrying from the re-rendered form with the right password works.
		res = b.post("/login", url.Values{"username": {f.restricted}, "password": {dashPassword}, "_csrf": {res.csrf(t)}})
		require.Equal(t, http.StatusSeeOther, res.status)
	})
}

func TestDashboardLoginRequiresCSRFToken(t *testing.T) {
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		creds := url.Values{"username": {f.global}, "password": {dashPassword}}

		// No token, no cookies at all: a cross-site form post.
		b := newDashBrowser(t, f.s)
		res := b.post("/login", creds)
		require.Equal(t, http.StatusForbidden, res.status)
		requirePageHeaders(t, res)
		require.Equal(t, "403", res.testid("error-status").Text())
		require.Nil(t, b.cookies["idemgate_session"])

		// A session and cookie from the form, but the field left out or wrong.
		form := b.get("/login")
		token := form.csrf(t)
		res = b.post("/login", creds)
		require.Equal(t, http.StatusForbidden, res.status)
		bad := url.Values{"username": creds["username"], "password": creds["password"], "_csrf": {token + "x"}}
		res = b.post("/login", bad)
		require.Equal(t, http.StatusForbidden, res.status)

		// Another browser's token does not work with this browser's session.
		other := newDashBrowser(t, f.s)
		otherToken := other.get("/login").csrf(t)
		b.get("/login")
		res = b.post("/login", url.Values{"username": creds["username"], "password": creds["password"], "_csrf": {otherToken}})
		require.Equal(t, http.StatusForbidden, res.status)
		require.Equal(t, http.StatusSeeOther, b.get("/keys").status, "still signed out")

		// Signed in, sign-out without the token is refused too.
		b.mustLogin(f.global)
		res = b.post("/logout", url.Values{})
		require.Equal(t, http.StatusForbidden, res.status)
		require.Equal(t, http.StatusOK, b.get("/keys").status, "still signed in")
	})
}

func TestDashboardLogout(t *testing.T) {
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		b := newDashBrowser(t, f.s)
		b.mustLogin(f.global)
		page := b.get("/keys")
		require.Equal(t, http.StatusOK, page.status)
		stolen := *b.cookies["idemgate_session"]
		token, ok := page.testid("logout-form").Find(`input[name="_csrf"]`).Attr("value")
		require.True(t, ok)

		res := b.post("/logout", url.Values{"_csrf": {token}})
		require.Equal(t, http.StatusSeeOther, res.status)
		require.Equal(t, "/login", res.header.Get("Location"))
		require.Nil(t, b.cookies["idemgate_session"], "the session cookie is expired")
		require.Equal(t, http.StatusSeeOther, b.get("/keys").status)

		// The old session id is dead on the server too.
		replay := newDashBrowser(t, f.s)
		replay.cookies[stolen.Name] = &stolen
		res = replay.get("/keys")
		require.Equal(t, http.StatusSeeOther, res.status)
		require.True(t, strings.HasPrefix(res.header.Get("Location"), "/login"))
	})
}

func TestDashboardKeysTenantScope(t *testing.T) {
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		f.acquire(t, f.pA, "a-key")
		f.acquire(t, f.pB, "b-key")

		restricted := newDashBrowser(t, f.s)
		restricted.mustLogin(f.restricted)
		page := restricted.get(f.keysURL(""))
		require.Equal(t, []string{"a-key"}, dashKeys(page.rows()))

		global := newDashBrowser(t, f.s)
		global.mustLogin(f.global)
		page = global.get(f.keysURL(""))
		require.Equal(t, http.StatusOK, page.status)
		require.Contains(t, page.testid("keys-scope").Text(), "All tenants")
		rows := page.rows()
		require.Equal(t, []string{"b-key", "a-key"}, dashKeys(rows))
		require.Equal(t, f.tenantB, rows[0].tenant)
		require.Equal(t, f.tenantA, rows[1].tenant)
	})
}

func TestDashboardKeysPagination(t *testing.T) {
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		var want []string
		for i := 0; i < 7; i++ {
			k := "page-key-" + string(rune('a'+i))
			f.acquire(t, f.pA, k)
			want = append([]string{k}, want...) // newest first
		}
		b := newDashBrowser(t, f.s)
		b.mustLogin(f.restricted)

		var got []string
		next := f.keysURL("limit=3")
		for pages := 0; next != ""; pages++ {
			require.Less(t, pages, 5, "pagination does not end")
			page := b.get(next)
			require.Equal(t, http.StatusOK, page.status, page.body)
			rows := page.rows()
			require.NotEmpty(t, rows)
			require.LessOrEqual(t, len(rows), 3)
			got = append(got, dashKeys(rows)...)
			if pages > 0 {
				newest, ok := page.testid("page-newest").Attr("href")
				require.True(t, ok)
				require.NotContains(t, newest, "cursor=")
				require.Contains(t, newest, "limit=3")
			} else {
				require.Equal(t, 0, page.testid("page-newest").Length())
			}
			next = page.testid("page-older").AttrOr("href", "")
			if next != "" {
				require.Contains(t, next, "cursor=")
				require.Contains(t, next, "operation="+f.op, "the filter is kept across pages")
			}
		}
		require.Equal(t, want, got, "every key exactly once, newest first")

		// A cursor that is not one is a clean 400.
		res := b.get(f.keysURL("cursor=not-a-cursor"))
		require.Equal(t, http.StatusBadRequest, res.status)
		require.Contains(t, res.testid("error-message").Text(), "cursor")
	})
}

func TestDashboardKeysStateFilter(t *testing.T) {
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		ctx := context.Background()
		f.acquire(t, f.pA, "running")
		rel := f.acquire(t, f.pA, "released")
		_, err := f.s.adm.Release(ctx, f.pA, services.ReleaseInput{Key: "released", OwnerToken: rel.OwnerToken})
		require.NoError(t, err)
		done := f.acquire(t, f.pA, "done")
		_, err = f.s.adm.RecordOutcome(ctx, f.pA, done.OperationID, services.OutcomeInput{OwnerToken: done.OwnerToken, Status: "succeeded"})
		require.NoError(t, err)

		b := newDashBrowser(t, f.s)
		b.mustLogin(f.restricted)
		all := b.get(f.keysURL(""))
		require.Equal(t, []string{"done", "released", "running"}, dashKeys(all.rows()))
		require.Equal(t, 0, all.testid("filter-state").Find("option[selected]").Length())

		for state, want := range map[string][]string{
			services.StateInProgress: {"running"},
			services.StateReleased:   {"released"},
			services.StateSucceeded:  {"done"},
			services.StateUncertain:  nil,
		} {
			page := b.get(f.keysURL("state=" + state))
			require.Equal(t, http.StatusOK, page.status, page.body)
			rows := page.rows()
			require.Equal(t, want, func() []string {
				if len(rows) == 0 {
					return nil
				}
				return dashKeys(rows)
			}(), state)
			for _, r := range rows {
				require.Equal(t, state, r.state)
			}
			require.Equal(t, state, page.testid("filter-state").Find("option[selected]").AttrOr("value", ""))
			if want == nil {
				require.Equal(t, 1, page.testid("keys-empty").Length())
			}
		}
		released := b.get(f.keysURL("state=released")).rows()[0]
		require.Equal(t, "—", released.ttl, "a released key has no TTL")

		res := b.get(f.keysURL("state=bogus"))
		require.Equal(t, http.StatusBadRequest, res.status)
		require.Contains(t, res.testid("error-message").Text(), "state")
		res = b.get(f.keysURL("limit=0"))
		require.Equal(t, http.StatusBadRequest, res.status)
	})
}

func TestDashboardLoginRateLimit(t *testing.T) {
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		newDashBrowser(t, f.s).mustLogin(f.global) // successful sign-ins are not counted
		b := newDashBrowser(t, f.s)
		for i := 0; i < loginAttempts; i++ {
			res := b.login(f.global, "not-the-password")
			require.Equal(t, http.StatusUnauthorized, res.status, "attempt %d", i+1)
		}
		res := b.login(f.global, dashPassword)
		require.Equal(t, http.StatusTooManyRequests, res.status)
		require.NotEmpty(t, res.header.Get("Retry-After"))
		require.Equal(t, "429", res.testid("error-status").Text())
		requirePageHeaders(t, res)
	})
}

func TestDashboardStaticAssets(t *testing.T) {
	s := newTestServer(t, dbs.SQLite)
	b := newDashBrowser(t, s)
	for name, ctype := range map[string]string{"app.css": "text/css", "app.js": "javascript", "logo.svg": "image/svg+xml"} {
		res := b.get(static.URL(name))
		require.Equal(t, http.StatusOK, res.status, name)
		require.Contains(t, res.header.Get("Content-Type"), ctype, name)
		require.Equal(t, "public, max-age=31536000, immutable", res.header.Get("Cache-Control"), name)
		require.Equal(t, "nosniff", res.header.Get("X-Content-Type-Options"))
		require.NotEmpty(t, res.body)

		res = b.get("/static/" + name)
		require.Equal(t, http.StatusOK, res.status)
		require.Equal(t, "public, max-age=300", res.header.Get("Cache-Control"), "unversioned URLs are cached briefly")
	}
	for _, p := range []string{"/static/nope.css", "/static/", "/static/static.go"} {
		res := b.get(p)
		require.Equal(t, http.StatusNotFound, res.status, p)
	}
}

func TestDashboardUnknownPageIsHTML(t *testing.T) {
	s := newTestServer(t, dbs.SQLite)
	res := newDashBrowser(t, s).get("/no-such-page")
	require.Equal(t, http.StatusNotFound, res.status)
	requirePageHeaders(t, res)
	require.Equal(t, "404", res.testid("error-status").Text())
}

func TestFormatTTL(t *testing.T) {
	for d, want := range map[time.Duration]string{
		-time.Second:                   "expired",
		0:                              "expired",
		300 * time.Millisecond:         "1s",
		42 * time.Second:               "42s",
		4*time.Minute + 12*time.Second: "4m 12s",
		4*time.Minute + 5*time.Second:  "4m 05s",
		3*time.Hour + 5*time.Minute:    "3h 05m",
		50*time.Hour + 10*time.Minute:  "2d 2h",
	} {
		require.Equal(t, want, formatTTL(d), d.String())
	}
}

func TestKeyRowTTL(t *testing.T) {
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	exp := now.Add(90 * time.Second)
	op := &services.Operation{State: services.StateInProgress, FencingToken: 3, ConflictAttempts: 2}
	held := keyRow(services.TenantKeyView{KeyView: services.KeyView{Key: "k", Held: true, ExpiresAt: &exp,
		AcquiredAt: now, Operation: op}, TenantName: "acme"}, now)
	require.Equal(t, "1m 30s", held.TTL)
	require.Equal(t, "90000", held.TTLMillis)
	require.Equal(t, "3", held.FencingToken)
	require.Equal(t, "+2 conflicts", held.Conflicts)
	require.Equal(t, "2030-01-02 03:04:05", held.AcquiredAt)

	lapsed := keyRow(services.TenantKeyView{KeyView: services.KeyView{Key: "k", AcquiredAt: now, Operation: op}}, now)
	require.Equal(t, "expired", lapsed.TTL)

	purged := keyRow(services.TenantKeyView{KeyView: services.KeyView{Key: "k", AcquiredAt: now}, TenantID: 7}, now)
	require.Equal(t, "—", purged.TTL)
	require.Equal(t, "", purged.State)
	require.Equal(t, "#7", purged.Tenant)
}

func TestSafeNext(t *testing.T) {
	for raw, want := range map[string]string{
		"/keys?state=uncertain": "/keys?state=uncertain",
		"/":                     "/",
		"":                      "",
		"keys":                  "",
		"//evil.example/":       "",
		"/\\evil.example":       "",
		"https://evil.example/": "",
		"/login":                "",
		"/logout?x=1":           "",
		"/keys\r\nSet-Cookie:x": "",
	} {
		require.Equal(t, want, safeNext(raw), raw)
	}
}
