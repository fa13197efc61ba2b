# The local environment: every region on this host, over loopback, run by
# stackctl (the repository's own program) through terraform_data
# provisioners, so only Terraform's built-in provider is needed.
#
#   make stack-up / stack-down / stack-outputs wrap this directory.

terraform {
  required_version = ">= 1.4"
  # The state lives in the stack's state dir: `terraform init
  # -backend-config=path=$STACK_STATE/terraform.tfstate` (the Makefile does).
  backend "local" {}
}

locals {
  names   = sort(keys(var.regions))
  index   = { for i, name in local.names : name => i + 1 }
  runner  = { stackctl = "${var.bin_dir}/stackctl", bin_dir = var.bin_dir, state_dir = var.state_dir }
  serfwan = { for name, i in local.index : name => "127.0.0.1:${var.ports.consul.serf_wan + (i - 1) * var.ports.region_stride}" }
}

module "region" {
  source   = "../../modules/region"
  for_each = var.regions

  name            = each.key
  region_index    = local.index[each.key]
  redis_mode      = each.value.redis_mode
  pops            = each.value.pops
  failover        = each.value.failover
  join_wan        = [for name, a in local.serfwan : a if name != each.key]
  key_salt        = coalesce(each.value.key_salt, var.key_salt)
  origin          = each.value.origin
  redis_timeout   = each.value.redis_timeout
  edge_workers    = each.value.edge_workers
  edge_extra_args = each.value.edge_extra_args
  ports           = var.ports
  runner          = local.runner
}

module "prometheus" {
  source          = "../../modules/prometheus"
  port            = var.ports.prometheus
  edge_admin_port = var.ports.edge.admin
  consuls         = { for name, r in module.region : name => r.consul_http_addr }
  exporters       = { for name, r in module.region : name => r.exporter_targets }
  runner          = local.runner
}

# What Terraform cannot see (a process that died) is not Terraform's to
# fix: scripts/stack.sh runs `stackctl reconcile --rules <rules_file>` after
# every apply (it restarts whatever died, pushes the rules and waits for
# every edge), so a plan after an apply is empty.
