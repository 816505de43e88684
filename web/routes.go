package web

import (
	"net/http"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/filesystem"
	"github.com/idemgate/idemgate/static"
)

// routes is the site map: every route of the service (docs/reference.md §4, §5 and §13), in the order Fiber
// matches them. Handlers live in the files named in the comments. The middleware New installs
// with Use runs first for every request; everything else is attached per route, never with a
// catch-all Use, so no dashboard middleware (sessions, CSRF) runs for the JSON API.
func (s *Server) routes(metricsGuard, metricsHandler fiber.Handler) {
	app := s.app

	// Health, metrics and the API's description (server.go, metrics.go, openapi.go): no
	// account; /metrics asks for Config.MetricsToken when one is set.
	app.Get("/healthz", s.handleHealthz)
	app.Get("/readyz", s.handleReadyz)
	app.Get("/metrics", metricsGuard, metricsHandler)
	app.Get("/openapi.json", handleOpenAPI)

	// JSON API (api.go): an API key, and only identity-encoded bodies.
	v1 := app.Group("/v1", identityEncoding, apiAuth(s.auth, s.authFails))
	v1.Post("/acquire", handleAcquire(s.adm))
	v1.Post(batchRoute, handleAcquireBatch(s.adm)) // POST /v1/acquire:batch (api_batch.go)
	v1.Post("/release", handleRelease(s.adm))
	v1.Post("/operations/:id/outcome", handleOutcome(s.adm))
	v1.Post(renewRoute, handleRenew(s.adm))
	v1.Get("/operations", handleListOperations(s.reads))
	v1.Get("/operations/:id", handleGetOperation(s.reads, s.awaiter))
	v1.Get("/keys", handleListKeys(s.reads))
	v1.Get("/keys/*", handleGetKey(s.reads))
	v1.Get("/attempts", handleListAttempts(s.reads))
	v1.Get("/policy", handlePolicy(s.policies))                   // api_policy.go
	v1.Post(reconciliationsRoute, handleReconciliations(s.recon)) // api_reconciliations.go

	// MCP (mcp.go): the admission calls as tools for AI agents, with the API key of /v1.
	app.Post(mcpPath, mcpChallenge, identityEncoding, apiAuth(s.auth, s.authFails), s.handleMCP())

	// The dashboard (dashboard*.go). One CSRF middleware protects every form; on a page it
	// also issues the token of the page's forms, the sign-out form at least.
	csrfProtect := s.csrfMiddleware()
	signedIn := s.requireOperator

	// Static assets (dashboard.go): the stylesheet, script and icon, cached by content hash.
	app.Use(static.Prefix, staticHeaders, filesystem.New(filesystem.Config{Root: http.FS(static.FS)}))

	// Signing in and out (dashboard_login.go). Only failed sign-ins count against the limit.
	app.Get("/login", pageHeaders, s.redirectSignedIn, csrfProtect, handleLoginForm())
	app.Post("/login", pageHeaders, s.loginLimiter(), csrfProtect, handleLogin(s))
	app.Post("/logout", pageHeaders, signedIn, csrfProtect, handleLogout(s))

	// Pages every role may view: Keys (dashboard_keys.go), Overview (dashboard_overview.go)
	// and the reconciliation queue (dashboard_queue.go).
	app.Get("/keys", pageHeaders, signedIn, csrfProtect, handleKeysPage(s))
	app.Get("/", pageHeaders, signedIn, csrfProtect, handleOverviewPage(s))
	app.Get(queueURL, pageHeaders, signedIn, csrfProtect, handleQueuePage(s))
	app.Get(queueURL+"/next", pageHeaders, signedIn, handleQueueNext(s))
	// Bulk reconciliation (dashboard_bulk.go): the queue's form creates one job; its page
	// lists what was done and skipped.
	app.Post(queueURL+"/jobs", pageHeaders, signedIn, csrfProtect, s.requireBulkActor, handleBulkReconcile(s))
	app.Get(queueURL+"/jobs/:id", pageHeaders, signedIn, csrfProtect, handleJobPage(s))

	// Explore (dashboard_explore.go): the playback of one sandbox key's life, for every role.
	// Its steps change nothing but the playback's own sandbox store.
	app.Get(exploreURL, pageHeaders, signedIn, csrfProtect, handleExplorePage(s))
	app.Post(exploreURL+"/next", pageHeaders, signedIn, csrfProtect, handleExploreNext(s))
	app.Post(exploreURL+"/reset", pageHeaders, signedIn, csrfProtect, handleExploreReset())

	// An operation and its actions (dashboard_operation.go). requireActor refuses read-only
	// accounts after the CSRF check and before the handler; the services check the role again.
	app.Get("/operations/:id", pageHeaders, signedIn, csrfProtect, handleOperationPage(s))
	app.Post("/operations/:id/outcome", pageHeaders, signedIn, csrfProtect, s.requireActor, handleOperationOutcome(s))
	app.Post("/operations/:id/release", pageHeaders, signedIn, csrfProtect, s.requireActor, handleOperationRelease(s))

	// The audit log and its CSV export (dashboard_audit.go), for every role. The export is a
	// download, not a page with forms, so it takes no CSRF token.
	app.Get("/audit", pageHeaders, signedIn, csrfProtect, handleAuditPage(s))
	app.Get("/audit.csv", pageHeaders, signedIn, handleAuditCSV(s))

	// Admin: API keys and operator accounts (dashboard_admin.go), for global admins only.
	// requireAdmin runs before the CSRF check, so a non-admin is refused with 403 whatever it
	// sends; the services check the account again.
	admin := func(h fiber.Handler) []fiber.Handler {
		return []fiber.Handler{pageHeaders, signedIn, s.requireAdmin, csrfProtect, h}
	}
	app.Get(adminURL, admin(handleAdminPage(s))...)
	app.Post(adminURL+"/api-keys", admin(handleAdminKeyCreate(s))...)
	app.Post(adminURL+"/api-keys/:id/revoke", admin(handleAdminKeyRevoke(s))...)
	app.Post(adminURL+"/operators", admin(handleAdminOperatorCreate(s))...)
	app.Post(adminURL+"/operators/:id/role", admin(handleAdminOperatorRole(s))...)
	app.Post(adminURL+"/operators/:id/delete", admin(handleAdminOperatorDelete(s))...)

	// Policies (dashboard_policies.go): on the admin page, for global admins.
	app.Post(adminPoliciesURL, admin(handleAdminPolicySet(s))...)
	app.Post(adminPoliciesURL+"/delete", admin(handleAdminPolicyDelete(s))...)
	// Webhooks (dashboard_webhooks.go): endpoints on the admin page, for global admins; the
	// delivery log for every role, scoped to the account's tenant. Only with Config.Webhooks.
	if s.webhooks != nil {
		app.Post(adminWebhooksURL, admin(handleAdminWebhookCreate(s))...)
		app.Post(adminWebhooksURL+"/:id/delete", admin(handleAdminWebhookDelete(s))...)
		app.Post(adminWebhooksURL+"/:id/disable", admin(handleAdminWebhookDisable(s, true))...)
		app.Post(adminWebhooksURL+"/:id/enable", admin(handleAdminWebhookDisable(s, false))...)
		app.Get(webhookDeliveriesURL, pageHeaders, signedIn, csrfProtect, handleWebhookDeliveriesPage(s))
	}
}
