// Package kubeenv runs a real Kubernetes API server for tests: etcd and kube-apiserver
// as child processes on loopback, built from their Go modules by scripts/tools.sh
// (`make tools`), with no kubelet, scheduler or controller manager. Objects the tests
// create (namespaces, service accounts, pods bound to a node) are stored and watched
// like real ones; TokenRequest, TokenReview, RBAC, informers and server-side dry run are
// the real thing.
//
// It owns the two processes, their ports and a temporary directory (etcd's data, the
// API server's serving certificate, the service-account signing key, the static admin
// token, logs). It does not own the objects in the server: tests create what they need
// in namespaces of their own.
//
// ToolPath finds a built tool (kube-apiserver, etcd, helm, spiffe-helper) in the same
// directory scripts/tools.sh builds into. A missing tool is an error that says
// "run make tools": tests that need one fail, they never skip.
//
// # One server per test package
//
// Starting takes a few seconds and about 300 MB, so a package starts one Env in TestMain
// and its tests share it, each in its own namespace:
//
//	var kube *kubeenv.Env
//
//	func TestMain(m *testing.M) {
//		env, err := kubeenv.Start(context.Background(), kubeenv.Options{})
//		if err != nil {
//			fmt.Fprintln(os.Stderr, err)
//			os.Exit(1)
//		}
//		kube = env
//		code := m.Run()
//		env.Stop()
//		if code == 0 {
//			if err := goleak.Find(); err != nil { ... }
//		}
//		os.Exit(code)
//	}
//
// The child processes are started with a parent-death signal, so a test binary that
// crashes or is killed does not leave them running.
//
// # Concurrency
//
// An Env's methods may be called from several goroutines, except Restart and Stop,
// which the caller must not run concurrently with each other or with Restart/Stop of the
// same Env. Requests made while the API server restarts fail as they would against a
// real restarting server.
package kubeenv
