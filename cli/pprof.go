package cli

import (
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"runtime"
	"time"
)

// Sampling of the block and mutex profiles while the profiler is served. Both cost next to
// nothing when off, which is why they are only turned on with IDEMGATE_PPROF_ADDR.
const (
	// pprofBlockRate samples on average one blocking event per this many nanoseconds blocked
	// (runtime.SetBlockProfileRate): every wait of 10 µs or more is recorded, shorter ones
	// in proportion, which keeps the profile cheap at thousands of requests a second.
	pprofBlockRate = 10_000
	// pprofMutexFraction records one in this many contended mutex events.
	pprofMutexFraction = 100
)

// startPprof serves net/http/pprof's handlers under /debug/pprof/ on addr (a loopback address,
// checked by LoadConfig), on a listener and mux of their own: nothing of the profiler is
// reachable through the API's listener. It turns block and mutex profiling on for the life of
// the process. The returned stop closes the listener. Errors: addr cannot be bound.
func startPprof(addr string, log *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	runtime.SetBlockProfileRate(pprofBlockRate)
	runtime.SetMutexProfileFraction(pprofMutexFraction)
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	// No WriteTimeout: a CPU profile or trace answers only after the seconds it was asked for.
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("profiler stopped", "err", err)
		}
	}()
	log.Warn("serving Go's profiler (IDEMGATE_PPROF_ADDR); block and mutex profiling is on", "addr", "http://"+ln.Addr().String()+"/debug/pprof/")
	return func() {
		_ = srv.Close() // a profile being taken is cut off rather than waited for
		runtime.SetBlockProfileRate(0)
		runtime.SetMutexProfileFraction(0)
	}, nil
}
