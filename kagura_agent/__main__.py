from kagura_agent.cli.main import main

raise SystemExit(main())
