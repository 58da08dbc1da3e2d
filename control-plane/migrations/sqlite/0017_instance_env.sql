-- Variables set on a live sandbox (SandboxService.SetEnv), as a JSON object:
-- added to its later execs and runs. Never a secret.
ALTER TABLE instances ADD COLUMN env TEXT;
