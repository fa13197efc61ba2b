# One process of the local stack, run by stackctl: `stackctl up` with the
# component's spec (JSON) when created, `stackctl down ID` when destroyed.
# A changed spec replaces the component (stop, then start anew): an in-place
# update would run no provisioner. Every other module runs its processes
# through this one.

variable "id" {
  type        = string
  description = "The component's id in the state directory (e.g. consul-eu-west)."
}

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
    id        = var.id
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
    command     = "\"$STACKCTL\" down \"$ID\""
    environment = { STACKCTL = self.input.stackctl, STACK_STATE = self.input.state_dir, ID = self.input.id }
  }
}

output "id" {
  description = "Known once the process runs: depend on it to order components."
  value       = terraform_data.this.id
}
