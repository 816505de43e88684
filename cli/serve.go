package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/idemgate/idemgate/services"
	"github.com/idemgate/idemgate/web"
	"github.com/idemgate/idemgate/web/buildinfo"
	"github.com/idemgate/idemgate/web/telemetry"
)

// traceFlushTimeout bounds the flush of queued spans at exit: a collector that is down must
// not hold the process.
const traceFlushTimeout = 5 * time.Second

// traceServiceVersion is service.version on spans: the main module's version as the Go build
// recorded it, or the VCS revision of a development build ("" when neither was recorded).
func traceServiceVersion() string {
	info := buildinfo.Read()
	if info.Version != "(devel)" {
		return info.Version
	}
	return info.Revision
}

// flushTraces sends the spans still queued (the last requests') and stops the exporter.
func flushTraces(tel *telemetry.Telemetry) {
	ctx, cancel := context.WithTimeout(context.Background(), traceFlushTimeout)
	defer cancel()
	_ = tel.Shutdown(ctx)
}

// serveGOGC is the garbage collector's target (GOGC, percent of the live heap the heap may grow
// by before the next collection) that serve sets when GOGC is not in its environment; a GOGC
// that is set, and GOMEMLIMIT, are left to the Go runtime as given. idemgate's live heap is
// small and its garbage is per request (bodies, JSON, rows), so at Go's default of 100 the
// collector ran often and took a noticeable share of the CPU; 400 answers more acquires a second
// for somewhat more resident memory (measured: docs/operations.md "Figures behind the code").
const serveGOGC = 400

// applyGOGC sets serveGOGC unless GOGC is in the environment.
func applyGOGC(getenv func(string) string) {
	if getenv("GOGC") == "" {
		debug.SetGCPercent(serveGOGC)
	}
}

// serve runs the HTTP server and the reaper until SIGINT/SIGTERM, then shuts down gracefully:
// stop accepting, finish in-flight requests (bounded by IDEMGATE_SHUTDOWN_TIMEOUT), close the
// pool.
//
// It binds IDEMGATE_ADDR before it touches the database: a mistyped address or a port another
// process holds then stops serve before it migrates anything or prints one-time secrets that
// nobody could use (the bootstrap secrets of a start that fails would be lost with it).
func serve(ctx context.Context, env Env) error {
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// Tracing first, so the database opens traced; spans still queued are flushed last.
	tel, err := telemetry.Setup(ctx, env.Getenv, traceServiceVersion())
	if err != nil {
		return fmt.Errorf("tracing: %w", err)
	}
	defer flushTraces(tel)
	cfg, log, err := configure(env)
	if err != nil {
		return err
	}
	applyGOGC(env.Getenv)
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		log.Error("cannot listen", "addr", cfg.Addr, "err", err)
		return fmt.Errorf("IDEMGATE_ADDR=%s: %w", cfg.Addr, err)
	}
	defer ln.Close() // after Serve took it, closing again is harmless
	db, err := openDB(ctx, cfg, log, tel.TracerProvider)
	if err != nil {
		log.Error("cannot start", "err", err)
		return err
	}
	defer db.Close()
	if tel.Enabled() {
		telemetry.LogErrors(log)
		log.Info("exporting traces", "protocol", tel.Protocol, "trace_keys", tel.TraceKeys)
	}
	if cfg.PprofAddr != "" {
		stopPprof, err := startPprof(cfg.PprofAddr, log)
		if err != nil {
			log.Error("cannot serve the profiler", "addr", cfg.PprofAddr, "err", err)
			return err
		}
		defer stopPprof()
	}
	svc := services.New(db, log, services.Options{
		MaxTTL: cfg.MaxTTL, GroupAdmission: cfg.GroupAdmission, GroupLinger: cfg.GroupLinger,
		Retention: cfg.Retention, StoreTimeout: cfg.StoreTimeout,
		MaxWaiters: cfg.MaxWaiters, ListenURL: cfg.ListenDatabaseURL, NoListen: !cfg.Listen,
		WebhookAllowPrivate: cfg.WebhookAllowPrivate, Dispatch: cfg.Webhooks,
		WebhookPoll: cfg.WebhookPoll, WebhookTimeout: cfg.WebhookTimeout,
	})
	go svc.Auth.WarmUp()
	bctx, cancel := context.WithTimeout(ctx, cfg.StartTimeout)
	boot, err := svc.Accounts.Bootstrap(bctx, cfg.AdminPassword, cfg.BootstrapAPIKey)
	cancel()
	if err != nil {
		log.Error("cannot bootstrap", "err", err)
		return err
	}
	// docs/reference.md §7: each generated secret is printed once, here, and never again.
	if boot.AdminPassword != "" {
		log.Warn("created dashboard account 'admin'; this password is shown only once", "username", "admin", "password", boot.AdminPassword)
	} else if boot.AdminCreated {
		log.Info("created dashboard account 'admin' with IDEMGATE_ADMIN_PASSWORD")
	} else if cfg.AdminPassword != "" {
		// Applying it on every start would silently undo a password changed since, and would let
		// whoever edits the environment take over an account; so it only seeds the first one.
		log.Warn("IDEMGATE_ADMIN_PASSWORD is ignored: dashboard accounts exist already, and it only sets the first admin's password. "+
			"Change a password with: idemgate operator passwd USERNAME", "variable", "IDEMGATE_ADMIN_PASSWORD")
	}
	if boot.APIKey != "" {
		log.Warn("created API key for tenant 'default'; this secret is shown only once", "api_key", boot.APIKey)
	} else if boot.APIKeyCreated {
		log.Info("created API key for tenant 'default' from IDEMGATE_BOOTSTRAP_API_KEY")
	} else if boot.APIKeyIgnored {
		log.Warn("IDEMGATE_BOOTSTRAP_API_KEY is ignored: API keys exist already, and it only seeds the first one, "+
			"so unless it was stored on an earlier start it does not authenticate. "+
			"Create a key with: idemgate apikey create --tenant NAME", "variable", "IDEMGATE_BOOTSTRAP_API_KEY")
	}

	awaitCtx, stopAwait := context.WithCancel(context.Background())
	defer stopAwait()
	go svc.Awaiter.Run(awaitCtx)
	srv := web.New(web.Config{
		Services: svc, Log: log, SecureCookies: cfg.SecureCookies,
		MetricsToken: cfg.MetricsToken, StoreTimeout: cfg.StoreTimeout,
		TracerProvider: tel.TracerProvider, TraceKeys: tel.TraceKeys,
	})
	reaperCtx, stopReaper := context.WithCancel(context.Background())
	defer stopReaper()
	go svc.Reaper.WithObserver(srv.Observer()).Run(reaperCtx, cfg.ReapInterval)
	// The webhook dispatcher (docs/reference.md §10) stops with the reaper: an in-flight POST is
	// cancelled and its claim lapses, so another instance (or this one after a restart)
	// delivers it again with the same webhook-id.
	dispatcherDone := make(chan struct{})
	if svc.Dispatcher != nil {
		go func() { defer close(dispatcherDone); svc.Dispatcher.Run(reaperCtx) }()
	} else {
		close(dispatcherDone)
	}

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	addr := ln.Addr().String() // the port the kernel chose, for IDEMGATE_ADDR=…:0
	log.Info("listening on http://"+addr, "addr", "http://"+addr, "dialect", db.Dialect,
		"dashboard", "http://"+addr+"/login")
	select {
	case err := <-errc:
		log.Error("server stopped", "err", err)
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down", "timeout", cfg.ShutdownTimeout.String())
	stopReaper()
	<-dispatcherDone
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}
