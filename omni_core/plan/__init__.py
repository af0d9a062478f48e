"""Planning: from a resolved deployment and a GPU inventory to a DeploymentPlan."""
