package trustroots

import (
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/test/agentproc"
	"github.com/meshagent/meshagent/test/istioca"
)

// The agent binary runs the OUTPUT_CERTS reload command after each
// rotation, with the new files in place, and writes the single-file
// bundle and the modes asked for.
func TestReloadCommand(t *testing.T) {
	a := newRoot(t, "root-a")
	ca := istioca.Start(t, istioca.Config{CA: a.ca, Tokens: map[string]istioca.ServiceAccount{workloadToken: workload}})
	dir := agentproc.TempDir(t)
	rootFile := filepath.Join(dir, "root-cert.pem")
	write(t, rootFile, a.ca.RootPEM())
	write(t, filepath.Join(dir, "istio-token"), []byte(workloadToken))
	log := filepath.Join(dir, "hook-log")
	if err := os.Mkdir(log, 0o755); err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(dir, "reload.sh")
	write(t, script, fmt.Appendf(nil, `n=$(ls %[1]q | grep -c chain)
cp "$OUTPUT_CERTS/cert-chain.pem" %[1]q/$n.chain
cp "$OUTPUT_CERTS/key.pem" %[1]q/$n.key
cp "$OUTPUT_CERTS/bundle.pem" %[1]q/$n.bundle
`, log))
	out := filepath.Join(dir, "out")
	agentproc.Start(t, dir,
		"STATUS_PORT=0", "MESHAGENT_STATUS_HOST=127.0.0.1", "MESHAGENT_XDS_PROXY=false",
		"CA_ADDR="+ca.Addr(), "ISTIOD_SAN="+istioca.DefaultServerName, "CA_ROOT_CA="+rootFile,
		"POD_NAMESPACE="+workload.Namespace, "SERVICE_ACCOUNT="+workload.Name,
		"MESHAGENT_TOKEN_PATH="+filepath.Join(dir, "istio-token"),
		"SECRET_TTL=4s", "SECRET_GRACE_PERIOD_RATIO_JITTER=0",
		"OUTPUT_CERTS="+out, "MESHAGENT_OUTPUT_CERTS_BUNDLE_FILE=bundle.pem", "MESHAGENT_OUTPUT_CERTS_KEY_MODE=0640",
		"MESHAGENT_OUTPUT_CERTS_RELOAD_COMMAND=/bin/sh "+script,
	)
	// Three certificates: the first and two rotations.
	testwait.Within(t, 30*time.Second, "the reload command to run after two rotations", func() bool {
		_, err := os.Stat(filepath.Join(log, "2.bundle"))
		return err == nil
	})
	serials := map[string]bool{}
	for i := range 3 {
		read := func(ext string) []byte {
			data, err := os.ReadFile(filepath.Join(log, strconv.Itoa(i)+"."+ext))
			if err != nil {
				t.Fatal(err)
			}
			return data
		}
		chain, key, bundle := read("chain"), read("key"), read("bundle")
		pair, err := tls.X509KeyPair(chain, key)
		if err != nil {
			t.Fatalf("run %d found a pair that does not match: %v", i, err)
		}
		if string(bundle) != string(key)+string(chain) {
			t.Errorf("run %d: the bundle is not the key then the chain", i)
		}
		serials[pair.Leaf.SerialNumber.String()] = true
	}
	if len(serials) < 2 {
		t.Errorf("the runs saw %d certificates", len(serials))
	}
	if fi, err := os.Stat(filepath.Join(out, "key.pem")); err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("key.pem mode: %v, %v", fi.Mode(), err)
	}
}
