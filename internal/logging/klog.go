package logging

import (
	"github.com/go-logr/zapr"
	"go.uber.org/zap"
	"k8s.io/klog/v2"
)

// RouteKlog sends klog's output (what client-go logs: API warnings, watch
// and retry messages) to l, named "client-go", so the agent writes one log
// format. klog's verbosity V(n) becomes zap level -n: V(0) lines are Info,
// V(1) Debug, and chattier ones are dropped. klog is process-wide: the last
// call wins, and the returned func puts klog back on its own output.
func RouteKlog(l *zap.Logger) (restore func()) {
	klog.SetLogger(zapr.NewLogger(l.Named("client-go")))
	return klog.ClearLogger
}
