from gpud.service.cli import main

raise SystemExit(main())
