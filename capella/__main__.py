from capella.cli import main

raise SystemExit(main())
