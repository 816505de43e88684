package web

import (
	"github.com/idemgate/idemgate/web/buildinfo"
	"github.com/prometheus/client_golang/prometheus"
)

// registerBuildInfo exports idemgate_build_info{version,revision,goversion} 1, so dashboards
// can tell which build each instance runs (and spot a half-finished rollout). revision is ""
// for a binary built outside a checkout; a checkout with uncommitted changes gets the suffix
// "-modified".
func registerBuildInfo(reg prometheus.Registerer) {
	info := buildinfo.Read()
	rev := info.Revision
	if rev != "" && info.Modified {
		rev += "-modified"
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "idemgate_build_info",
		Help:        "Always 1; the labels say which build of idemgate this process runs.",
		ConstLabels: prometheus.Labels{"version": info.Version, "revision": rev, "goversion": info.GoVersion},
	})
	g.Set(1)
	reg.MustRegister(g)
}
