package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// removeSandboxes stops and removes every pod sandbox (and so its containers, network
// namespace and mounts) through containerd's CRI service, as the kubelet would.
func (c *Cluster) removeSandboxes() error {
	conn, err := grpc.NewClient("unix://"+c.containerdSock(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	rt := runtimeapi.NewRuntimeServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	list, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return fmt.Errorf("listing pod sandboxes: %w", err)
	}
	var errs []error
	for _, sb := range list.Items {
		if _, err := rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			errs = append(errs, fmt.Errorf("stopping sandbox %s: %w", sb.Metadata.GetName(), err))
		}
		if _, err := rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			errs = append(errs, fmt.Errorf("removing sandbox %s: %w", sb.Metadata.GetName(), err))
		}
	}
	c.logf("removed %d pod sandboxes", len(list.Items))
	return errors.Join(errs...)
}
