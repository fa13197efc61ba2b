# One process of the local stack, run by stackctl: `stackctl up` with the
# component's spec (JSON) when created, `stackctl down` with the same spec
# when destroyed (stackctl names the component from its spec: no id is
# spelled here).
# A changed spec replaces the component (stop, then start anew): an in-place
# update would run no provisioner. Every other module runs its processes
# through this one.

variable "spec" {
  type        = any
  description = "What stackctl starts: kind, binary directory and the kind's settings."
}

variable "runner" {
  type = object({
    stackctl  = string
    bin_dir   = string
    state_dir = string
  })
}

resource "terraform_data" "this" {
  triggers_replace = [jsonencode(var.spec)]
  input = {
    spec      = jsonencode(var.spec)
    stackctl  = var.runner.stackctl
    state_dir = var.runner.state_dir
  }

  provisioner "local-exec" {
    command     = "\"$STACKCTL\" up"
    environment = { STACKCTL = self.input.stackctl, STACK_STATE = self.input.state_dir, STACK_SPEC = self.input.spec }
  }

  provisioner "local-exec" {
    when        = destroy
    command     = "\"$STACKCTL\" down"
    environment = { STACKCTL = self.input.stackctl, STACK_STATE = self.input.state_dir, STACK_SPEC = self.input.spec }
  }
}

output "id" {
  description = "Known once the process runs: depend on it to order components."
  value       = terraform_data.this.id
}
