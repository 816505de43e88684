package cli

import (
	"context"
	"errors"
	"net"
	"os/signal"
	"syscall"

	"github.com/idemgate/idemgate/services"
	"github.com/idemgate/idemgate/web"
)

// serve runs the HTTP server and the reaper until SIGINT/SIGTERM, then shuts down gracefully:
// stop accepting, finish in-flight requests (bounded by IDEMGATE_SHUTDOWN_TIMEOUT), close the
// pool.
func serve(ctx context.Context, env Env) error {
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	cfg, log, db, err := open(ctx, env)
	if err != nil {
		if log != nil {
			log.Error("cannot start", "err", err)
		}
		return err
	}
	defer db.Close()
	if cfg.PprofAddr != "" {
		stopPprof, err := startPprof(cfg.PprofAddr, log)
		if err != nil {
			log.Error("cannot serve the profiler", "addr", cfg.PprofAddr, "err", err)
			return err
		}
		defer stopPprof()
	}
	auth := services.NewAuth(db, log)
	go auth.WarmUp()
	bctx, cancel := context.WithTimeout(ctx, cfg.StartTimeout)
	boot, err := auth.Bootstrap(bctx, cfg.AdminPassword, cfg.BootstrapAPIKey)
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
	}
	if boot.APIKey != "" {
		log.Warn("created API key for tenant 'default'; this secret is shown only once", "api_key", boot.APIKey)
	} else if boot.APIKeyCreated {
		log.Info("created API key for tenant 'default' from IDEMGATE_BOOTSTRAP_API_KEY")
	}

	sqlDB, err := db.SQL()
	if err != nil {
		return err
	}
	awaiter := services.NewAwaiter(db, services.AwaiterConfig{MaxWaiters: cfg.MaxWaiters, ListenURL: cfg.ListenDatabaseURL, Log: log})
	awaitCtx, stopAwait := context.WithCancel(context.Background())
	defer stopAwait()
	go awaiter.Run(awaitCtx)
	srv := web.New(web.Config{
		Admission: services.NewAdmission(db, log, cfg.MaxTTL).WithGroupAdmission(cfg.GroupAdmission), Reads: services.NewReads(db),
		Reconciliation: services.NewReconciliation(db), Dashboard: services.NewDashboard(db), Audit: services.NewAudit(db),
		Auth: auth, Log: log, DB: sqlDB, Pool: db.Pool,
		Sessions: services.NewSessionStore(db).WithTimeout(cfg.StoreTimeout), SecureCookies: cfg.SecureCookies,
		MetricsToken: cfg.MetricsToken, StoreTimeout: cfg.StoreTimeout, Awaiter: awaiter,
	})
	reaperCtx, stopReaper := context.WithCancel(context.Background())
	defer stopReaper()
	go services.NewReaper(db, log, cfg.Retention).WithObserver(srv.Observer()).Run(reaperCtx, cfg.ReapInterval)

	// Bind before saying we listen, so a taken port is the only thing reported.
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		log.Error("cannot listen", "addr", cfg.Addr, "err", err)
		return err
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Info("idemgate listening", "addr", "http://"+cfg.Addr, "dialect", db.Dialect,
		"dashboard", "http://"+cfg.Addr+"/login")
	select {
	case err := <-errc:
		log.Error("server stopped", "err", err)
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down", "timeout", cfg.ShutdownTimeout.String())
	stopReaper()
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}
