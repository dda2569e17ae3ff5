package facility

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
	"github.com/numastream/numastream/internal/render"
)

// taskCPUs is, for every agent process of pod `pod` (a container's HOSTNAME is its pod's name),
// each stage's CPUs as the kernel allows its threads: Cpus_allowed_list of
// /proc/<pid>/task/<tid>/status, the thread named "<stage>-<index>" by the agent.
func taskCPUs(t *testing.T, pod string) map[string]map[int]bool {
	t.Helper()
	out := map[string]map[int]bool{}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		cmd, err := os.ReadFile(filepath.Join(p, "cmdline"))
		if err != nil || !strings.Contains(string(cmd), "numastream-agent") {
			continue
		}
		env, err := os.ReadFile(filepath.Join(p, "environ"))
		if err != nil || !strings.Contains("\x00"+string(env)+"\x00", "\x00HOSTNAME="+pod+"\x00") {
			continue
		}
		tasks, _ := filepath.Glob(filepath.Join(p, "task", "[0-9]*"))
		for _, task := range tasks {
			comm, err := os.ReadFile(filepath.Join(task, "comm"))
			if err != nil {
				continue
			}
			name := strings.TrimSpace(string(comm))
			dash := strings.LastIndex(name, "-")
			if dash < 0 {
				continue
			}
			if _, err := strconv.Atoi(name[dash+1:]); err != nil {
				continue
			}
			stage := name[:dash]
			if stage == "io" {
				continue
			}
			f, err := os.Open(filepath.Join(task, "status"))
			if err != nil {
				continue
			}
			sc := bufio.NewScanner(f)
			for sc.Scan() {
				if v, ok := strings.CutPrefix(sc.Text(), "Cpus_allowed_list:"); ok {
					if out[stage] == nil {
						out[stage] = map[int]bool{}
					}
					for cpu := range parseCPUList(t, strings.TrimSpace(v)) {
						out[stage][cpu] = true
					}
				}
			}
			f.Close()
		}
	}
	return out
}

func parseCPUList(t *testing.T, s string) map[int]bool {
	out := map[int]bool{}
	for _, part := range strings.Split(s, ",") {
		if part == "" {
			continue
		}
		lo, hi, found := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			t.Fatalf("cpulist %q", s)
		}
		b := a
		if found {
			if b, err = strconv.Atoi(hi); err != nil {
				t.Fatalf("cpulist %q", s)
			}
		}
		for c := a; c <= b; c++ {
			out[c] = true
		}
	}
	return out
}

func cpuSetString(m map[int]bool) string {
	var ids []int
	for c := range m {
		ids = append(ids, c)
	}
	sort.Ints(ids)
	return fmt.Sprint(ids)
}

// A running pipeline's status says where each of its stages runs, from the agents' own report,
// next to the plan; it matches what the kernel allows the agents' threads (their
// /proc/<pid>/task/*/status), stage by stage, for the gateway pod and the sender pod.
func TestStatusPlacementIsWhereTheKernelRunsTheAgentsThreads(t *testing.T) {
	sp := pipeline(t, ns, "placement", 0, "")
	if err := k8s.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	defer deleteAndCheckGone(t, sp)
	flowing(t, sp, "the stream flows", 20)
	var rows []v1beta1.StagePlacement
	eventually(t, "status.observed.placement for the sender and the gateway", 90*time.Second, func() (bool, string) {
		o := get(t, sp).Status.Observed
		if o == nil {
			return false, "no observed status"
		}
		roles := map[string]bool{}
		for _, r := range o.Placement {
			roles[r.Role] = true
		}
		rows = o.Placement
		return roles["sender"] && roles["gateway"], fmt.Sprintf("placement %+v", o.Placement)
	})
	for _, r := range rows {
		t.Logf("stream %d %-7s %-7s %-10s %d threads on CPUs %s, NUMA %s (planned %s, on plan %v)",
			r.Stream, r.Role, r.Agent, r.Stage, r.Threads, r.CPUs, r.NUMANodes, r.Planned, r.OnPlan)
	}
	for _, role := range []string{render.RoleGateway, render.RoleSender} {
		pod := running(t, sp, role)
		if pod == nil {
			t.Fatalf("no running %s pod", role)
		}
		kernel := taskCPUs(t, pod.Name)
		status := map[string]map[int]bool{}
		for _, r := range rows {
			if r.Role != role {
				continue
			}
			if status[r.Stage] == nil {
				status[r.Stage] = map[int]bool{}
			}
			for c := range parseCPUList(t, r.CPUs) {
				status[r.Stage][c] = true
			}
		}
		if len(status) == 0 || len(kernel) == 0 {
			t.Errorf("%s %s: status stages %v, threads found in /proc %v", role, pod.Name, status, kernel)
			continue
		}
		for stage, cpus := range status {
			if got := cpuSetString(kernel[stage]); got != cpuSetString(cpus) {
				t.Errorf("%s %s stage %s: status says CPUs %s, the kernel allows its threads %s", role, pod.Name, stage,
					cpuSetString(cpus), got)
			} else {
				t.Logf("%s %s stage %s: status CPUs %s = the threads' Cpus_allowed_list", role, pod.Name, stage, got)
			}
		}
	}
}
