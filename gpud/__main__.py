from gpud.cli import main

raise SystemExit(main())
